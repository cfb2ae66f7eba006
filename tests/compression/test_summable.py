"""Summed payloads: integer codes on shared scales add up exactly, and never overflow."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from globaldl.compression import CompressionConfig, GradientCompressor
from globaldl.compression.lanes import (
    lane_bits_for,
    lane_word,
    levels_for,
    max_ranks,
    packed_bytes,
)
from globaldl.compression.summable import SCALE_RANGE, FloatSum, LaneSum

NUMPY_DTYPES = {"uint8": np.uint8, "int32": np.int32, "int64": np.int64}


def numpy_sum(payloads: list[tf.Tensor], dtype: str) -> np.ndarray:
    """What Gloo's allreduce computes: the elementwise sum in the payload's own dtype."""
    stacked = np.stack([p.numpy() for p in payloads]).astype(NUMPY_DTYPES[dtype])
    return np.sum(stacked, axis=0, dtype=NUMPY_DTYPES[dtype])


def test_lanes_go_into_the_narrowest_word_horovod_can_sum() -> None:
    assert lane_word(8) == ("uint8", 1)
    assert lane_word(4) == ("uint8", 2)
    assert lane_word(12) == ("int64", 5)  # 12.8 bits per value (int32 would take 16)
    assert lane_word(16) == ("int64", 3)
    assert [levels_for(8, n) for n in (1, 2, 16, 127)] == [127, 63, 7, 1]
    with pytest.raises(ValueError, match="128 ranks cannot sum 8-bit lanes.*1..127"):
        levels_for(8, 128)


def test_more_ranks_need_wider_lanes_and_wider_lanes_weigh_more_bytes() -> None:
    assert [lane_bits_for(n, at_least=8) for n in (2, 127, 128, 1000, 10_000)] == [
        8,
        8,
        9,
        11,
        15,
    ]
    assert (lane_bits_for(1), lane_bits_for(3)) == (2, 3)  # 2-bit lanes sum one rank's codes
    # 1902 lanes: a byte each at 8 bits; five 11-bit lanes per int64 word (12.8 bits each);
    # two 15-bit lanes per int32 (16 bits each: int64 holds four, no better).
    assert packed_bytes(1902, 8) == 1902
    assert packed_bytes(1902, 11) == 381 * 8
    assert packed_bytes(1902, 15) == 951 * 4
    with pytest.raises(ValueError, match="40000 ranks cannot sum.*at most 32767"):
        lane_bits_for(40_000)


@pytest.mark.parametrize(("lane_bits", "ranks"), [(8, 3), (4, 2), (12, 16), (16, 5)])
def test_the_sum_of_payloads_decodes_to_the_sum_of_each_ranks_codes_numpy_reference(
    lane_bits: int, ranks: int
) -> None:
    rng = np.random.default_rng(lane_bits)
    groups = np.repeat(np.arange(3, dtype=np.int32), [50, 7, 20])
    encoding = LaneSum(lane_bits, ranks, groups, 3)
    # powers of two, as the controller keeps them: then codes x scale is exact in float32
    scales = tf.constant([2.0**-7, 0.5, 2.0**-6], tf.float32)
    levels = encoding.levels
    payloads, reconstructions, codes = [], [], []
    for _ in range(ranks):
        values = rng.normal(size=groups.size).astype(np.float32) * np.array([1, 30, 0.05])[groups]
        payload, reconstruction = encoding.encode(tf.constant(values), tf.constant(False), scales)
        assert payload.dtype.name == encoding.dtype
        assert int(tf.size(payload)) == encoding.payload_elements
        scale_of_value = scales.numpy()[groups]
        expected = np.clip(np.round(values / scale_of_value), -levels, levels)
        np.testing.assert_array_equal(reconstruction.numpy(), expected * scale_of_value)
        payloads.append(payload)
        reconstructions.append(reconstruction.numpy())
        codes.append(expected)
    summed = tf.constant(numpy_sum(payloads, encoding.dtype))
    decoded = encoding.decode(summed, ranks, scales)
    # sum of decoded == decoded of sum, exactly
    np.testing.assert_array_equal(
        decoded.values.numpy(), np.sum(codes, axis=0) * scales.numpy()[groups]
    )
    np.testing.assert_array_equal(decoded.values.numpy(), np.sum(reconstructions, axis=0))
    assert not bool(decoded.any_nonfinite)


@pytest.mark.parametrize("lane_bits", range(2, 17))
def test_the_integer_sum_never_overflows_at_the_largest_supported_rank_count(
    lane_bits: int,
) -> None:
    ranks = max_ranks(lane_bits)
    groups = np.zeros(6, np.int32)
    encoding = LaneSum(lane_bits, ranks, groups, 1)
    levels = encoding.levels
    assert 2 * levels * ranks <= 2**lane_bits - 1  # the bound the codec is built on
    scales = tf.constant([1.0])
    # every rank at the top of the range, flags and counters all set: each lane at its maximum
    top, _ = encoding.encode(tf.fill([6], 1e9), tf.constant(True), scales)
    bottom, _ = encoding.encode(tf.fill([6], -1e9), tf.constant(True), scales)
    for payloads, expected in (
        ([top] * ranks, levels * ranks),
        ([bottom] * ranks, -levels * ranks),
    ):
        in_dtype = numpy_sum(payloads, encoding.dtype)
        exact = sum(p.numpy().astype(object) for p in payloads)  # Python ints: no wraparound
        np.testing.assert_array_equal(in_dtype.astype(object), exact)
        decoded = encoding.decode(tf.constant(in_dtype), ranks, scales)
        np.testing.assert_array_equal(decoded.values.numpy(), np.full(6, float(expected)))
        assert bool(decoded.any_nonfinite)
    with pytest.raises(ValueError, match="cannot sum"):
        LaneSum(lane_bits, ranks + 1, groups, 1)


def test_the_shared_scale_follows_the_largest_rank_without_an_extra_round() -> None:
    groups = np.repeat(np.arange(2, dtype=np.int32), [10, 10])
    encoding = LaneSum(8, 4, groups, 2)  # 31 levels
    scales = tf.constant([1.0, 1.0])
    quiet = np.r_[np.full(10, 0.1), np.full(10, 1000.0)].astype(np.float32)
    loud = np.r_[np.full(10, 0.2), np.full(10, 20.0)].astype(np.float32)
    payloads = [
        encoding.encode(tf.constant(v), tf.constant(False), scales)[0] for v in (quiet,) * 3
    ]
    payloads.append(encoding.encode(tf.constant(loud), tf.constant(False), scales)[0])
    new = encoding.decode(tf.constant(numpy_sum(payloads, "uint8")), 4, scales).scales.numpy()
    # group 0: max 0.2 against a range of 31 -> shrink by the most allowed, 2**-3
    assert new[0] == 2.0**-SCALE_RANGE
    # group 1: max 1000 against 31 -> grow by the most allowed, 2**3, on every rank alike
    assert new[1] == 2.0**SCALE_RANGE
    # within reach: the next scale is s * 2**ceil(log2(max / (s L))), so max fits in s' L
    near = tf.constant([2.0**-8, 16.0])
    payloads = [encoding.encode(tf.constant(v), tf.constant(False), near)[0] for v in (quiet, loud)]
    fitted = encoding.decode(tf.constant(numpy_sum(payloads, "uint8")), 2, near).scales.numpy()
    for group, largest in ((0, 0.2), (1, 1000.0)):
        scale = near.numpy()[group]
        assert fitted[group] == scale * 2.0 ** np.ceil(np.log2(largest / (scale * 31)))
        assert fitted[group] * 31 >= largest > fitted[group] * 31 / 2


def test_float_sums_carry_the_flag_in_their_last_element() -> None:
    from globaldl.compression import FP16

    encoding = FloatSum(FP16(), "float16", 3)
    payload, reconstruction = encoding.encode(tf.constant([1.0, 2.0, 3.0]), tf.constant(True), None)
    assert payload.dtype == tf.float16 and payload.numpy().tolist() == [1.0, 2.0, 3.0, 1.0]
    decoded = encoding.decode(payload + payload, 2, None)
    assert decoded.values.numpy().tolist() == [2.0, 4.0, 6.0] and bool(decoded.any_nonfinite)


@pytest.mark.parametrize("prune", ["none", "shared-randomk", "shared-topk"])
def test_intsum_with_error_feedback_sends_every_gradient_in_the_end(prune: str) -> None:
    """Sent so far + residual = the sum of the gradients, on every rank (EF bookkeeping)."""
    ranks, shapes = 3, [(30, 20), (8,)]
    config = CompressionConfig(prune=prune, quantize="intsum", density=0.05)
    compressors = [
        GradientCompressor(
            config,
            [tf.Variable(tf.zeros(s)) for s in shapes],
            steps_per_epoch=10,
            rank=rank,
            num_ranks=ranks,
        )
        for rank in range(ranks)
    ]
    rng = np.random.default_rng(3)
    total_gradient = [[np.zeros(s) for s in shapes] for _ in range(ranks)]
    total_averaged = [np.zeros(s) for s in shapes]
    for step in range(6):
        payloads, updates = [], []
        for rank, compressor in enumerate(compressors):
            gradients = [rng.normal(size=s).astype(np.float32) * 0.01 for s in shapes]
            payload, update = compressor.compress(
                [tf.constant(g) for g in gradients], tf.constant(step, tf.int64)
            )
            payloads.append(payload)
            updates.append(update)
            for i, g in enumerate(gradients):
                total_gradient[rank][i] += g
        summed = tf.constant(numpy_sum(payloads, compressors[0].wire_spec.dtype))
        finals = []
        for compressor, update in zip(compressors, updates, strict=True):
            averaged, nonfinite, final = compressor.decompress_update(summed, None, ranks, update)
            assert not bool(nonfinite)
            compressor.apply_state(final)
            finals.append(final)
        for i, a in enumerate(averaged):
            total_averaged[i] += a.numpy()
        # the shared state (scales, score) is the same on every rank after every step
        for a, b in zip(
            compressors[0].shared_state_variables,
            compressors[2].shared_state_variables,
            strict=True,
        ):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    residuals = [c.unflatten(c.local_state_variables[0]) for c in compressors]
    for i in range(len(shapes)):
        # ranks x average sent = sum over ranks of (gradients - residual)
        expected = sum(total_gradient[r][i] - residuals[r][i].numpy() for r in range(ranks))
        np.testing.assert_allclose(ranks * total_averaged[i], expected, atol=1e-5)
