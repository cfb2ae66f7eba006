"""Deep Gradient Compression: warm-up, momentum correction, masking and clipping vs NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from globaldl.compression import DGC, CompressionConfig, GradientCompressor
from globaldl.compression.sparsifier import kept_count


def test_dgc_warmup_density_schedule():
    dgc = DGC(warmup_epochs=4)
    densities = [float(dgc.density_at(0.001, tf.constant(e, tf.int64))) for e in range(7)]
    assert densities == pytest.approx([0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001, 0.001])
    densities = [float(dgc.density_at(0.01, tf.constant(e, tf.int64))) for e in range(5)]
    assert densities == pytest.approx([0.25, 0.0625, 0.015625, 0.01, 0.01])
    assert float(DGC(warmup_epochs=0).density_at(0.001, tf.constant(0, tf.int64))) == 0.001


def sparse_count(compressor: GradientCompressor, payload: tf.Tensor) -> int:
    decoded = compressor.wire.decode(
        payload, tf.size(payload)[tf.newaxis], compressor.dense_elements
    )
    return int(tf.size(decoded.sparse_positions))


def test_dgc_sends_the_warmup_count_of_each_epoch():
    variables = [tf.Variable(tf.zeros([4096]))]
    compressor = GradientCompressor(
        CompressionConfig(prune="dgc", density=0.001, quantize="int8", warmup_epochs=4),
        variables,
        steps_per_epoch=10,
    )
    gradient = [tf.constant(np.random.default_rng(0).normal(size=4096).astype(np.float32))]
    counts = [
        sparse_count(compressor, compressor.compress(gradient, tf.constant(step, tf.int64))[0])
        for step in (0, 9, 10, 20, 30, 40, 95)
    ]
    assert counts == [1024, 1024, 256, 64, 16, 4, 4]


def numpy_dgc_step(g, u, v, momentum, sparse_slice, k):
    """One DGC step on a flat vector whose sparse_slice is pruned to its top k, the rest dense."""
    u = momentum * u + g
    v = v + u
    sent = np.zeros_like(v)
    part = v[sparse_slice]
    top = np.argsort(-np.abs(part))[:k]
    sent_sparse = np.zeros_like(part)
    sent_sparse[top] = part[top]
    sent[sparse_slice] = sent_sparse
    dense = np.ones_like(v, bool)
    dense[sparse_slice] = False
    sent[dense] = v[dense]
    u_sparse = u[sparse_slice]
    u_sparse[top] = 0.0  # momentum factor masking, pruned tensor only
    u[sparse_slice] = u_sparse
    return sent, u, v - sent


def test_dgc_momentum_correction_and_masking_match_numpy_over_several_steps():
    variables = [tf.Variable(tf.zeros([2000])), tf.Variable(tf.zeros([8]))]
    config = CompressionConfig(
        prune="dgc", density=0.01, quantize="none", momentum=0.9, warmup_epochs=0
    )
    compressor = GradientCompressor(config, variables, steps_per_epoch=100)
    rng = np.random.default_rng(1)
    u = np.zeros(2008, np.float32)
    v = np.zeros(2008, np.float32)
    for step in range(5):
        g = rng.normal(size=2008).astype(np.float32)
        payload, update = compressor.compress(
            [tf.constant(g[:2000]), tf.constant(g[2000:])], tf.constant(step, tf.int64)
        )
        (sparse_out, dense_out), _ = compressor.decompress(payload, tf.size(payload)[tf.newaxis], 1)
        expected_sent, u, v = numpy_dgc_step(g, u, v, 0.9, slice(0, 2000), k=20)
        np.testing.assert_allclose(
            np.concatenate([sparse_out, dense_out]), expected_sent, atol=1e-5
        )
        compressor.apply_state(update)
        residual, momentum = (var.numpy() for var in compressor.step_state_variables)
        np.testing.assert_allclose(residual, v, atol=1e-5)
        np.testing.assert_allclose(momentum, u, atol=1e-5)
    assert compressor.applies_momentum


def test_dgc_clips_the_local_gradient_to_clip_norm_over_sqrt_ranks():
    variables = [tf.Variable(tf.zeros([3000]))]
    config = CompressionConfig(prune="dgc", clip_norm=2.0, quantize="none", warmup_epochs=0)
    compressor = GradientCompressor(config, variables, steps_per_epoch=10, num_ranks=16)
    gradient = np.random.default_rng(2).normal(size=3000).astype(np.float32) * 10.0
    payload, update = compressor.compress([tf.constant(gradient)], tf.constant(0, tf.int64))
    (sent,), _ = compressor.decompress(payload, tf.size(payload)[tf.newaxis], 1)
    residual = update.values[0].numpy()
    # First step from empty state: sent + remainder = the clipped gradient, norm 2 / sqrt(16).
    clipped = gradient * (2.0 / np.sqrt(16)) / np.linalg.norm(gradient)
    np.testing.assert_allclose(sent.numpy() + residual, clipped, rtol=1e-5, atol=1e-7)


def test_dgc_without_error_feedback_sends_the_top_k_of_the_momentum_and_keeps_no_remainder():
    variables = [tf.Variable(tf.zeros([3000]))]
    config = CompressionConfig(
        prune="dgc", quantize="none", error_feedback=False, warmup_epochs=0, momentum=0.5
    )
    compressor = GradientCompressor(config, variables, steps_per_epoch=10)
    assert [v.name for v in compressor.step_state_variables] == ["compression_momentum:0"]
    rng = np.random.default_rng(3)
    momentum = np.zeros(3000, np.float32)
    for step in range(3):
        gradient = rng.normal(size=3000).astype(np.float32)
        payload, update = compressor.compress([tf.constant(gradient)], tf.constant(step, tf.int64))
        (sent,), _ = compressor.decompress(payload, tf.size(payload)[tf.newaxis], 1)
        momentum = 0.5 * momentum + gradient
        top = np.argsort(-np.abs(momentum))[: kept_count(3000, 0.01)]
        expected = np.zeros_like(momentum)
        expected[top] = momentum[top]
        np.testing.assert_allclose(sent.numpy(), expected, atol=1e-6)
        momentum[top] = 0.0
        compressor.apply_state(update)
        np.testing.assert_allclose(compressor.step_state_variables[0].numpy(), momentum, atol=1e-6)
