"""GradientCompressor end to end: every prune x quantize pair, several simulated ranks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from globaldl.compression import (
    PRUNE_NAMES,
    QUANTIZE_NAMES,
    Combine,
    CompressionConfig,
    GradientCompressor,
)

SHAPES = [(40, 30), (3, 3, 8, 16), (16,), (), (0,), (5, 7)]  # two pruned, four sent dense
RANKS = 3
AGREED = ("none", "shared-randomk", "shared-topk")  # every rank sends the same positions
SUMMABLE = ("none", "fp16", "intsum")
# Every gathered pair, every summed pair, and one gathered pair with agreed positions
# (powersgd takes two rounds: test_powersgd.py; intsum needs agreed positions).
PAIRS = list(
    dict.fromkeys(
        [
            *itertools.product(("none", "topk", "randomk", "threshold", "dgc"), QUANTIZE_NAMES[:6]),
            *itertools.product(AGREED, ("none", "fp16", "intsum")),
            ("shared-randomk", "int8"),
        ]
    )
)
assert set(QUANTIZE_NAMES[:6]) == {"none", "fp16", "int8", "qsgd", "terngrad", "sign"}
assert {p for p, _ in PAIRS} | {"powersgd"} == set(PRUNE_NAMES)


def make_compressors(config: CompressionConfig, ranks: int = RANKS, shapes=SHAPES):
    variables = [tf.Variable(tf.zeros(shape)) for shape in shapes]
    return [
        GradientCompressor(config, variables, steps_per_epoch=10, rank=rank, num_ranks=ranks)
        for rank in range(ranks)
    ]


def random_gradients(rng: np.random.Generator, shapes=SHAPES) -> list[np.ndarray]:
    return [rng.normal(size=shape).astype(np.float32) for shape in shapes]


def test_intsum_refuses_a_sparsifier_whose_positions_differ_between_ranks():
    with pytest.raises(ValueError, match=r"quantize='intsum' adds codes across ranks.*prune="):
        make_compressors(CompressionConfig(prune="topk", quantize="intsum"), ranks=1)


def exchange(compressor: GradientCompressor, payloads: list[tf.Tensor]):
    """What the exchange hands to decompress: the sum (allreduce) or the concatenation."""
    if compressor.combine is Combine.SUM:
        return tf.add_n(payloads), None
    lengths = tf.constant([int(tf.size(p)) for p in payloads], tf.int32)
    return tf.concat(payloads, axis=0), lengths


def sent_by(
    compressor: GradientCompressor, gradients: list[np.ndarray], update
) -> list[np.ndarray]:
    """What one rank sent, from error feedback: (gradient + old residual) - new residual."""
    if not compressor.step_state_variables:
        return gradients
    old = compressor.unflatten(compressor.step_state_variables[0])
    new = compressor.unflatten(update.values[0])
    return [g + o.numpy() - n.numpy() for g, o, n in zip(gradients, old, new, strict=True)]


@pytest.mark.parametrize(("prune", "quantize"), PAIRS)
def test_every_combination_decodes_to_the_average_of_what_each_rank_sent(prune, quantize):
    config = CompressionConfig(prune=prune, quantize=quantize, density=0.01, warmup_epochs=4)
    compressors = make_compressors(config)
    first = compressors[0]
    rng = np.random.default_rng(len(prune) * 10 + len(quantize))
    step = tf.constant(25, tf.int64)  # epoch 2: DGC still warming up (1.5625%)
    payloads, sent, updates = [], [], []
    for compressor in compressors:
        gradients = random_gradients(rng)
        payload, update = compressor.compress([tf.constant(g) for g in gradients], step)
        payloads.append(payload)
        updates.append(update)
        sent.append(sent_by(compressor, gradients, update))

    summable = prune in AGREED and quantize in SUMMABLE
    assert first.combine is (Combine.SUM if summable else Combine.GATHER)
    sum_dtypes = {"fp16": tf.float16, "none": tf.float32, "intsum": tf.uint8}
    expected_dtype = sum_dtypes[quantize] if summable else tf.uint8
    for payload in payloads:
        assert payload.dtype == expected_dtype and payload.shape.rank == 1
        assert int(first.wire_bytes(payload)) == int(tf.size(payload)) * expected_dtype.size
        if first.fixed_payload_bytes is not None:
            assert int(first.wire_bytes(payload)) == first.fixed_payload_bytes
    assert (first.fixed_payload_bytes is None) == (prune in ("threshold", "dgc"))
    assert first.raw_bytes_per_step == 4 * sum(int(np.prod(s)) for s in SHAPES)

    if prune in AGREED:  # the same positions on every rank
        for update in updates[1:]:
            np.testing.assert_array_equal(update.carry[0].numpy(), updates[0].carry[0].numpy())
    exchanged, lengths = exchange(first, payloads)
    averaged, any_nonfinite, _ = first.decompress_update(
        exchanged, lengths, tf.constant(RANKS), updates[0]
    )
    assert not bool(any_nonfinite)
    tolerance = 3e-3 if quantize == "fp16" and summable else 1e-5  # fp16 allreduce sums in fp16
    for index, shape in enumerate(SHAPES):
        assert averaged[index].dtype == tf.float32 and tuple(averaged[index].shape) == shape
        expected = np.mean([rank_sent[index] for rank_sent in sent], axis=0)
        np.testing.assert_allclose(
            averaged[index].numpy(), expected, atol=tolerance, rtol=tolerance
        )
    if prune in ("topk", "randomk", "shared-randomk", "shared-topk"):
        # at most k = round(0.01 * size) entries of each pruned tensor were sent per rank
        # (exactly k, unless the quantizer rounded some to zero), dense tensors went whole
        for rank_sent in sent:
            counts = [np.count_nonzero(rank_sent[i]) for i in (0, 1, 2)]
            if quantize in ("none", "fp16") and prune != "shared-topk":
                assert counts == [12, 12, 16]
            assert counts[0] <= 12 and counts[1] <= 12


@pytest.mark.parametrize("quantize", ["int8", "sign"])
def test_ranks_whose_kept_entries_lie_in_one_tensor_decode_separately(quantize):
    shapes = [(3000,), (10,)]
    config = CompressionConfig(prune="topk", quantize=quantize, density=0.1, block_size=64)
    compressors = make_compressors(config, ranks=3, shapes=shapes)
    rng = np.random.default_rng(12)
    payloads, sent = [], []
    for rank, compressor in enumerate(compressors):
        gradients = [g * 10.0**rank for g in random_gradients(rng, shapes)]  # different scales
        payload, update = compressor.compress([tf.constant(g) for g in gradients], tf.constant(0))
        payloads.append(payload)
        sent.append(sent_by(compressor, gradients, update))
    exchanged, lengths = exchange(compressors[0], payloads)
    averaged, _ = compressors[0].decompress(exchanged, lengths, tf.constant(3))
    for index in range(2):
        expected = np.mean([s[index] for s in sent], axis=0)
        np.testing.assert_allclose(averaged[index].numpy(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("prune", "quantize"),
    [
        ("none", "none"),
        ("none", "fp16"),
        ("topk", "int8"),
        ("threshold", "sign"),
        ("dgc", "qsgd"),
        ("randomk", "terngrad"),
    ],
)
def test_nonfinite_gradients_on_one_rank_flag_the_step_and_leave_its_state_untouched(
    prune, quantize
):
    compressors = make_compressors(CompressionConfig(prune=prune, quantize=quantize))
    rng = np.random.default_rng(5)
    # one good step first, so the state is not all zeros
    for compressor in compressors:
        _, update = compressor.compress(
            [tf.constant(g) for g in random_gradients(rng)], tf.constant(0, tf.int64)
        )
        compressor.apply_state(update)
    payloads, updates = [], []
    for rank, compressor in enumerate(compressors):
        gradients = random_gradients(rng)
        if rank == 1:
            gradients[0][3, 4] = np.nan
            gradients[2][0] = np.inf
        payload, update = compressor.compress(
            [tf.constant(g) for g in gradients], tf.constant(1, tf.int64)
        )
        payloads.append(payload)
        updates.append(update)
    bad = compressors[1]
    for before, after in zip(bad.step_state_variables, updates[1].values, strict=True):
        np.testing.assert_array_equal(after.numpy(), before.numpy())
    exchanged, lengths = exchange(bad, payloads)
    averaged, any_nonfinite = bad.decompress(exchanged, lengths, tf.constant(RANKS))
    assert bool(any_nonfinite)
    assert all(np.all(np.isfinite(a.numpy())) for a in averaged)
    # the good ranks alone do not raise the flag
    good = [payloads[0], payloads[2]]
    exchanged, lengths = exchange(bad, good)
    assert not bool(bad.decompress(exchanged, lengths, tf.constant(2))[1])


@pytest.mark.parametrize(
    ("prune", "quantize"),
    [
        ("topk", "sign"),
        ("randomk", "qsgd"),
        ("threshold", "int8"),
        ("none", "terngrad"),
        ("none", "fp16"),
    ],
)
def test_with_error_feedback_sent_plus_residual_equals_the_sum_of_gradients(prune, quantize):
    (compressor,) = make_compressors(
        CompressionConfig(prune=prune, quantize=quantize, density=0.02), ranks=1
    )
    rng = np.random.default_rng(6)
    total_gradient = [np.zeros(s, np.float64) for s in SHAPES]
    total_sent = [np.zeros(s, np.float64) for s in SHAPES]
    for step in range(4):
        gradients = random_gradients(rng)
        payload, update = compressor.compress(
            [tf.constant(g) for g in gradients], tf.constant(step, tf.int64)
        )
        exchanged, lengths = exchange(compressor, [payload])
        decoded, _ = compressor.decompress(exchanged, lengths, tf.constant(1))
        compressor.apply_state(update)
        for i in range(len(SHAPES)):
            total_gradient[i] += gradients[i]
            total_sent[i] += decoded[i].numpy()
    residual = compressor.unflatten(compressor.step_state_variables[0])
    for i in range(len(SHAPES)):
        np.testing.assert_allclose(
            total_sent[i] + residual[i].numpy(), total_gradient[i], atol=1e-4
        )
    assert any(np.abs(r.numpy()).max() > 1e-5 for r in residual if r.shape.num_elements())  # lossy


def test_without_error_feedback_topk_sends_the_plain_top_k_and_keeps_no_state():
    (compressor,) = make_compressors(
        CompressionConfig(prune="topk", quantize="none", density=0.01, error_feedback=False),
        ranks=1,
    )
    assert compressor.state_variables == []
    rng = np.random.default_rng(7)
    for step in range(2):
        gradients = random_gradients(rng)
        payload, update = compressor.compress(
            [tf.constant(g) for g in gradients], tf.constant(step, tf.int64)
        )
        assert update.values == ()
        (first, *_), _ = compressor.decompress(payload, None, tf.constant(1))
        expected = np.zeros(1200, np.float32)
        top = np.argsort(-np.abs(gradients[0].ravel()))[:12]
        expected[top] = gradients[0].ravel()[top]
        np.testing.assert_array_equal(first.numpy().ravel(), expected)


@pytest.mark.parametrize(
    ("prune", "quantize"), [("topk", "sign"), ("dgc", "int8"), ("none", "fp16")]
)
def test_compress_exchange_decompress_and_apply_run_inside_one_tf_function(prune, quantize):
    config = CompressionConfig(prune=prune, quantize=quantize, density=0.01)
    compressors = make_compressors(config, ranks=2)
    eager_twins = make_compressors(config, ranks=2)
    rng = np.random.default_rng(8)
    gradients = [[tf.constant(g) for g in random_gradients(rng)] for _ in range(2)]

    def one_step(instances, grads, step):
        payloads, updates = zip(
            *(c.compress(g, step) for c, g in zip(instances, grads, strict=True)), strict=True
        )
        if instances[0].combine is Combine.SUM:
            exchanged, lengths = tf.add_n(payloads), None
        else:
            exchanged = tf.concat(payloads, axis=0)
            lengths = tf.stack([tf.size(p) for p in payloads])
        averaged, nonfinite = instances[0].decompress(exchanged, lengths, tf.constant(2))
        for c, u in zip(instances, updates, strict=True):
            c.apply_state(u)
        return averaged, nonfinite, [instances[0].wire_bytes(p) for p in payloads]

    traced = tf.function(lambda grads, step: one_step(compressors, grads, step), autograph=False)
    for step in range(2):
        averaged, nonfinite, wire = traced(gradients, tf.constant(step, tf.int64))
        eager_averaged, _, eager_wire = one_step(
            eager_twins, gradients, tf.constant(step, tf.int64)
        )
        assert not bool(nonfinite)
        assert [int(w) for w in wire] == [int(w) for w in eager_wire]
        for a, b in zip(averaged, eager_averaged, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)
    for traced_state, eager_state in zip(
        compressors[0].state_variables, eager_twins[0].state_variables, strict=True
    ):
        np.testing.assert_allclose(traced_state.numpy(), eager_state.numpy(), atol=1e-6)


def test_decompress_rejects_payloads_of_another_configuration():
    (sender,) = make_compressors(
        CompressionConfig(prune="threshold", quantize="int8", density=0.01), ranks=1
    )
    (receiver,) = make_compressors(
        CompressionConfig(prune="threshold", quantize="sign", density=0.01), ranks=1
    )
    payload, _ = sender.compress(
        [tf.constant(g) for g in random_gradients(np.random.default_rng(9))],
        tf.constant(0, tf.int64),
    )
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        receiver.decompress(payload, tf.size(payload)[tf.newaxis], tf.constant(1))


def test_constructor_and_compress_validate_their_arguments():
    variables = [tf.Variable(tf.zeros([4]))]
    with pytest.raises(ValueError, match=r"steps_per_epoch=0 is out of range"):
        GradientCompressor(CompressionConfig(), variables, steps_per_epoch=0)
    with pytest.raises(ValueError, match="must be a CompressionConfig"):
        GradientCompressor({"prune": "topk"}, variables, steps_per_epoch=1)
    compressor = GradientCompressor(CompressionConfig(), variables, steps_per_epoch=1)
    with pytest.raises(ValueError, match="got 2 gradients for 1 variables"):
        compressor.compress([tf.zeros([4]), tf.zeros([4])], tf.constant(0, tf.int64))
    with pytest.raises(ValueError, match=r"shape \[5\] but variable"):
        compressor.compress([tf.zeros([5])], tf.constant(0, tf.int64))


def test_state_variable_names_are_unique_and_stable():
    config = CompressionConfig(prune="dgc", quantize="int8", weight_sparsity=0.5)
    first, second = (make_compressors(config, ranks=1)[0] for _ in range(2))
    names = [v.name for v in first.state_variables]
    assert len(names) == len(set(names)) == 2 + 3  # residual, momentum, three kernel masks
    assert names == [v.name for v in second.state_variables]
    assert names[:2] == ["compression_residual:0", "compression_momentum:0"]


def test_dense_below_elements_chooses_the_tensors_sent_dense():
    (compressor,) = make_compressors(
        CompressionConfig(prune="topk", dense_below_elements=1200), ranks=1
    )
    assert [info.sparse for info in compressor.tensor_infos] == [
        True,
        False,
        False,
        False,
        False,
        False,
    ]
    (compressor,) = make_compressors(
        CompressionConfig(prune="topk", dense_below_elements=0), ranks=1
    )
    # with no dense threshold even a scalar is pruned (keeping its one entry); empty tensors never
    assert [info.sparse for info in compressor.tensor_infos] == [
        True,
        True,
        True,
        True,
        False,
        True,
    ]


def test_lengths_may_be_omitted_for_fixed_size_payloads_only():
    (compressor,) = make_compressors(CompressionConfig(prune="topk", quantize="sign"), ranks=1)
    gradients = [tf.constant(g) for g in random_gradients(np.random.default_rng(10))]
    payload, _ = compressor.compress(gradients, tf.constant(0, tf.int64))
    with_lengths, _ = compressor.decompress(
        tf.concat([payload, payload], 0), tf.constant([int(tf.size(payload))] * 2), 2
    )
    without, _ = compressor.decompress(tf.concat([payload, payload], 0), None, 2)
    for a, b in zip(with_lengths, without, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    (variable,) = make_compressors(CompressionConfig(prune="threshold"), ranks=1)
    with pytest.raises(ValueError, match="lengths=None"):
        variable.decompress(payload, None, 1)


def test_missing_gradients_count_as_zeros():
    (compressor,) = make_compressors(CompressionConfig(prune="topk", quantize="int8"), ranks=1)
    gradients = [tf.constant(g) for g in random_gradients(np.random.default_rng(11))]
    gradients[1] = None  # a variable the loss does not depend on
    payload, _ = compressor.compress(gradients, tf.constant(0, tf.int64))
    decoded, nonfinite = compressor.decompress(payload, None, 1)
    assert not bool(nonfinite)
    assert np.all(decoded[1].numpy() == 0.0) and np.any(decoded[0].numpy() != 0.0)


def test_get_config_reports_the_settings_and_sizes():
    (compressor,) = make_compressors(
        CompressionConfig(prune="topk", quantize="int8", density=0.05), ranks=1
    )
    config = compressor.get_config()
    assert config["prune"] == "topk" and config["density"] == 0.05 and config["combine"] == "gather"
    assert config["raw_bytes_per_step"] == compressor.raw_bytes_per_step
    assert config["fixed_payload_bytes"] == compressor.fixed_payload_bytes
    assert (
        CompressionConfig.from_config(
            {k: v for k, v in config.items() if k in CompressionConfig().get_config()}
        )
        == compressor.config
    )
