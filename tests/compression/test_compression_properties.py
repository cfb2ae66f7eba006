"""Property tests: any shapes, input dtypes and settings decode to the average of what was sent."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from globaldl.compression import (
    PRUNE_NAMES,
    QUANTIZE_NAMES,
    Combine,
    CompressionConfig,
    GradientCompressor,
)

shape = st.one_of(
    st.just(()),
    st.just((0,)),
    st.just((1,)),
    st.tuples(st.integers(1, 600)),
    st.tuples(st.integers(1, 40), st.integers(1, 40)),
    st.tuples(st.integers(1, 6), st.integers(0, 6), st.integers(1, 30)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(shape, min_size=1, max_size=4),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    prune=st.sampled_from(PRUNE_NAMES),
    quantize=st.sampled_from(QUANTIZE_NAMES),
    density=st.sampled_from([1e-6, 0.001, 0.05, 1.0]),
    dense_below=st.sampled_from([0, 8, 1024]),
    ranks=st.integers(1, 3),
    zeros=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_any_gradients_decode_to_the_float32_average_of_what_each_rank_sent(
    shapes, dtype, prune, quantize, density, dense_below, ranks, zeros, seed
):
    assume(prune != "powersgd")  # two rounds: test_powersgd.py
    assume(quantize != "intsum" or prune in ("none", "shared-randomk", "shared-topk"))
    config = CompressionConfig(
        prune=prune, quantize=quantize, density=density, dense_below_elements=dense_below
    )
    variables = [tf.Variable(tf.zeros(s)) for s in shapes]
    # built for the ranks it sums: integer codes leave room for exactly that many
    compressor = GradientCompressor(config, variables, steps_per_epoch=3, num_ranks=ranks)
    rng = np.random.default_rng(seed)
    payloads, sent = [], []
    for _ in range(ranks):
        gradients = [(np.zeros(s) if zeros else rng.normal(size=s)).astype(dtype) for s in shapes]
        payload, update = compressor.compress(
            [tf.constant(g) for g in gradients], tf.constant(seed, tf.int64)
        )
        payloads.append(payload)
        as_float32 = [g.astype(np.float32) for g in gradients]
        if update.values:
            residual = compressor.unflatten(update.values[0])
            as_float32 = [g - r.numpy() for g, r in zip(as_float32, residual, strict=True)]
        sent.append(as_float32)
    if compressor.combine is Combine.SUM:
        exchanged, lengths = tf.add_n(payloads), None
    else:
        exchanged = tf.concat(payloads, axis=0)
        lengths = tf.constant([int(tf.size(p)) for p in payloads])
        if compressor.fixed_payload_bytes is not None:
            assert all(int(tf.size(p)) == compressor.fixed_payload_bytes for p in payloads)
    averaged, nonfinite, _ = compressor.decompress_update(
        exchanged, lengths, tf.constant(ranks), update
    )
    assert not bool(nonfinite)
    tolerance = 3e-3 if compressor.payload_dtype == tf.float16 else 1e-5
    for index, s in enumerate(shapes):
        assert averaged[index].dtype == tf.float32 and tuple(averaged[index].shape) == s
        expected = np.mean([rank_sent[index] for rank_sent in sent], axis=0)
        np.testing.assert_allclose(
            averaged[index].numpy(), expected, atol=tolerance, rtol=tolerance
        )
        if zeros:
            assert np.all(averaged[index].numpy() == 0.0)


@pytest.mark.parametrize("prune", ["topk", "randomk"])
def test_density_rounding_to_zero_still_sends_one_entry_per_tensor(prune):
    shapes = [(), (1,), (7,), (300,), (0,)]
    config = CompressionConfig(prune=prune, quantize="none", density=1e-9, dense_below_elements=0)
    compressor = GradientCompressor(
        config, [tf.Variable(tf.zeros(s)) for s in shapes], steps_per_epoch=1
    )
    gradients = [
        tf.constant(np.random.default_rng(1).normal(size=s).astype(np.float32) + 5.0)
        for s in shapes
    ]
    payload, _ = compressor.compress(gradients, tf.constant(0, tf.int64))
    decoded, _ = compressor.decompress(payload, None, 1)
    assert [int(np.count_nonzero(d.numpy())) for d in decoded] == [1, 1, 1, 1, 0]
