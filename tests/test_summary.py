from __future__ import annotations

import copy
from pathlib import Path

import pytest

from globaldl import summary
from globaldl.compression.wire_spec import Combine, WireSpec
from globaldl.exchange import dense_device_tx_bytes_per_step_model, device_tx_bytes_per_step_model
from globaldl.summary import SummaryError

GOOD = {
    "schema_version": 1,
    "run_id": "run-1",
    "model": "lenet",
    "dataset": "mnist",
    "ranks": 2,
    "epochs": 2,
    "steps": 124,
    "global_batch_size": 64,
    "val_accuracy": 0.93,
    "val_loss": 0.25,
    "wall_seconds": 31.5,
    "phase_seconds": {
        "data_load": 0.1,
        "compute": 5.0,
        "compress": 0.0,
        "exchange": 2.0,
        "decompress": 0.0,
        "apply": 0.3,
    },
    "gradient_bytes_raw": 1000,
    "gradient_bytes_wire": 1000,
    "compression_ratio": 1.0,
    "compression": {"prune": "none", "density": 0.01, "quantize": "none", "error_feedback": True},
    "versions": {
        "tensorflow": "2.21.0",
        "horovod": "0.28.1",
        "globaldl": "0.1.0",
        "python": "3.11.7",
    },
}


def test_a_complete_summary_validates_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    summary.write(path, GOOD)
    assert summary.read(path) == GOOD


@pytest.mark.parametrize("field", ["ranks", "phase_seconds", "gradient_bytes_wire", "versions"])
def test_a_missing_field_is_named(field: str) -> None:
    broken = copy.deepcopy(GOOD)
    del broken[field]
    with pytest.raises(SummaryError, match=f"'{field}' is a required property"):
        summary.validate(broken)


def test_a_wrong_value_names_its_path() -> None:
    broken = copy.deepcopy(GOOD)
    broken["phase_seconds"]["compute"] = -1.0
    with pytest.raises(SummaryError, match="phase_seconds/compute"):
        summary.validate(broken)


def test_per_rank_totals_validate_and_a_negative_cpu_time_is_named() -> None:
    with_ranks = copy.deepcopy(GOOD)
    with_ranks["rank_totals"] = [
        {"phase_seconds": dict(GOOD["phase_seconds"]), "cpu_seconds": 12.5} for _ in range(2)
    ]
    summary.validate(with_ranks)
    with_ranks["rank_totals"][1]["cpu_seconds"] = -1.0
    with pytest.raises(SummaryError, match="rank_totals/1/cpu_seconds"):
        summary.validate(with_ranks)


def test_an_invalid_summary_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    broken = dict(GOOD, val_accuracy=1.5)
    with pytest.raises(SummaryError):
        summary.write(path, broken)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_summary_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    summary.write(path, GOOD)
    summary.write(path, dict(GOOD, run_id="run-2"))
    assert summary.read(path)["run_id"] == "run-2"
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_compression_ratio_is_raw_over_wire_and_none_without_traffic() -> None:
    assert summary.compression_ratio(5000, 50) == 100.0
    assert summary.compression_ratio(5000, 0) is None


def test_unwritable_summary_paths_are_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(SummaryError, match="does not exist"):
        summary.check_writable(tmp_path / "missing" / "s.json")
    with pytest.raises(SummaryError, match="is a directory"):
        summary.check_writable(tmp_path)
    # /proc takes no new files, not even from root: a directory that exists but refuses writes.
    with pytest.raises(SummaryError, match="not writable"):
        summary.check_writable(Path("/proc/s.json"))


def _gathered_traffic(ranks: int, raw: int, wire: int, steps: int) -> dict:
    """The traffic object the trainer writes for a fixed-length gathered codec."""
    spec = WireSpec(Combine.GATHER, "uint8", (wire // steps,))
    return summary.traffic(
        device_tx_bytes_per_step_model=device_tx_bytes_per_step_model(spec, ranks, wire / steps),
        dense_device_tx_bytes_per_step_model=dense_device_tx_bytes_per_step_model(
            raw // steps, ranks
        ),
        payload_bytes_per_step=wire / steps,
        collectives_outside_steps=[],
    )


def test_traffic_ratio_is_the_payload_ratio_only_on_two_ranks() -> None:
    # LeNet top-k 1% + int8: 246,824 dense bytes, 2,502 on the wire per step.
    raw, wire, steps = 246_824 * 10, 2_502 * 10, 10
    payload_ratio = summary.compression_ratio(raw, wire)
    two = _gathered_traffic(ranks=2, raw=raw, wire=wire, steps=steps)
    assert two["traffic_ratio_vs_dense"] == pytest.approx(payload_ratio)
    four = _gathered_traffic(ranks=4, raw=raw, wire=wire, steps=steps)
    # Each rank's payload reaches 3 peers; dense fp32 would go through a ring allreduce (1.5x).
    assert four["device_tx_bytes_per_step_model"] == pytest.approx(3 * 2_502)
    assert four["dense_device_tx_bytes_per_step_model"] == pytest.approx(1.5 * 246_824)
    assert four["traffic_ratio_vs_dense"] == pytest.approx(payload_ratio / 2)
    assert four["tx_bytes_per_wire_byte"] == 3
    summary.validate({**GOOD, "traffic": four})


def test_one_rank_sends_nothing_and_has_no_traffic_ratio() -> None:
    one = _gathered_traffic(ranks=1, raw=100, wire=100, steps=5)
    assert one["device_tx_bytes_per_step_model"] == 0
    assert one["traffic_ratio_vs_dense"] is None
    summary.validate({**GOOD, "traffic": one})


def test_an_unknown_combine_in_the_exchange_object_is_named() -> None:
    broken = {
        **GOOD,
        "exchange": {"combine": "mean", "collectives_per_step": 1, "hierarchy": "none"},
    }
    with pytest.raises(SummaryError, match="exchange/combine"):
        summary.validate(broken)


def test_the_steady_step_leaves_the_first_step_and_the_epoch_ends_out() -> None:
    phases = {"compute": 10.0, "exchange": 40.0}
    first = {"compute": 0.1, "exchange": 9.9}
    run = {"steps": 11, "phase_seconds": phases}
    run["rank_totals"] = [{"phase_seconds": phases, "first_step_phase_seconds": first}]
    # 40 s over the 10 steps after the first.
    assert summary.steady_step_seconds(run) == pytest.approx(4.0)
    assert summary.steady_phases(phases, first, 11) == (
        pytest.approx({"compute": 9.9, "exchange": 30.1}),
        10,
    )
    # Older summaries record no first step: no steady step, every step in the phases.
    del run["rank_totals"][0]["first_step_phase_seconds"]
    assert summary.steady_step_seconds(run) is None
    assert summary.steady_phases(phases, None, 11) == (phases, 11)
