"""The compression bench's verdicts on codec time, per row and per model."""

from globaldl.bench.compression import (
    COMBINATIONS,
    PRUNERS,
    QUANTIZERS,
    codec_verdict,
    model_summaries,
)


def _row(workload, prune, quantize, share):
    row = {
        "workload": workload,
        "prune": prune,
        "quantize": quantize,
        "codec_share_of_compute": share,
    }
    row["codec_within_target"] = codec_verdict(row)
    return row


def test_codec_within_ten_percent_of_compute_is_met_and_above_it_is_not():
    assert codec_verdict({"codec_share_of_compute": 0.10}) == "met"
    assert codec_verdict({"codec_share_of_compute": 0.1001}) == "NOT met"


def test_every_pruner_is_benched_with_every_quantizer():
    benched = {(prune, quantize) for prune, _, quantize in COMBINATIONS}
    assert {(p, q) for p in PRUNERS for q in QUANTIZERS} <= benched


def test_model_summary_judges_pruned_rows_against_the_models_own_target():
    rows = [
        _row("lenet", "none", "int8", 0.05),
        _row("lenet", "topk", "int8", 0.20),
        _row("lenet", "dgc", "sign", 0.24),
        _row("resnet20", "none", "qsgd", 0.32),
        _row("resnet20", "randomk", "int8", 0.11),
        _row("resnet20", "topk", "int8", 0.02),
    ]
    lenet, resnet = model_summaries(rows)
    assert lenet.startswith("lenet: codec <= 10% of compute met by 1 of 3 combinations")
    assert "every pruned combination <= 25%: met (worst dgc + sign, 24.0%)" in lenet
    assert resnet.startswith("resnet20: codec <= 10% of compute met by 1 of 3 combinations")
    assert "every pruned combination <= 10%: NOT met (worst randomk + int8, 11.0%)" in resnet
