"""Exact top-k through a sampled threshold: same entries as a full top-k, and error feedback."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import globaldl.compression.candidates as candidates
from globaldl.compression import CompressionConfig, GradientCompressor
from globaldl.compression.candidates import top_k_indices
from globaldl.compression.sparsifier import EXCLUDED


def seed(value: int) -> tf.Tensor:
    return tf.constant([value, 5], tf.int64)


def full_top_k(magnitudes: np.ndarray, k: int) -> np.ndarray:
    return np.sort(tf.math.top_k(magnitudes, k, sorted=False).indices.numpy())


def never_whole_tensor(monkeypatch):
    def refuse(*args):
        raise AssertionError("took a top-k over the whole tensor")

    monkeypatch.setattr(candidates, "_whole_tensor", refuse)


@pytest.mark.parametrize(
    ("size", "k"), [(48_000, 480), (36_864, 369), (200_000, 200), (60_000, 7500)]
)
def test_sampled_threshold_keeps_exactly_the_top_k_without_a_full_top_k(monkeypatch, size, k):
    rng = np.random.default_rng(size)
    reference = {}
    for s in range(5):
        magnitudes = np.abs(rng.laplace(size=size)).astype(np.float32)
        reference[s] = (magnitudes, full_top_k(magnitudes, k))
    never_whole_tensor(monkeypatch)
    for s, (magnitudes, expected) in reference.items():
        chosen = top_k_indices(tf.constant(magnitudes), k, seed(s)).numpy()
        np.testing.assert_array_equal(chosen, expected)


def test_ties_and_excluded_entries_break_as_a_full_top_k_does():
    magnitudes = np.repeat(np.arange(40, dtype=np.float32), 1000)  # 1000-fold ties
    np.random.default_rng(0).shuffle(magnitudes)
    magnitudes[::7] = EXCLUDED
    for k in (200, 1000, 2500):
        np.testing.assert_array_equal(
            top_k_indices(tf.constant(magnitudes), k, seed(k)).numpy(),
            full_top_k(magnitudes, k),
        )


def test_a_count_known_only_at_run_time_gives_the_same_entries():
    magnitudes = np.abs(np.random.default_rng(1).normal(size=200_000)).astype(np.float32)
    select = tf.function(lambda m, k: top_k_indices(m, k, seed(0)), autograph=False)
    for k in (20, 200, 5000):
        np.testing.assert_array_equal(
            select(tf.constant(magnitudes), tf.constant(k)).numpy(), full_top_k(magnitudes, k)
        )


def test_too_few_candidates_fall_back_to_the_full_top_k(monkeypatch):
    # Threshold at the largest sampled magnitude: only a handful of candidates reach it.
    monkeypatch.setattr(candidates, "sampled_rank", lambda num_kept, size: 1)
    magnitudes = np.random.default_rng(2).permutation(40_000).astype(np.float32)
    np.testing.assert_array_equal(
        top_k_indices(tf.constant(magnitudes), 1000, seed(0)).numpy(), full_top_k(magnitudes, 1000)
    )


@pytest.mark.parametrize("prune", ["topk", "randomk", "threshold", "dgc"])
def test_residual_plus_sent_is_gradient_plus_old_residual_on_a_large_tensor(prune):
    shapes = [(120, 400), (84, 120), (10,)]
    variables = [tf.Variable(tf.zeros(s)) for s in shapes]
    config = CompressionConfig(prune=prune, quantize="int8", density=0.01, warmup_epochs=0)
    compressor = GradientCompressor(config, variables, steps_per_epoch=1)
    rng = np.random.default_rng(3)
    for step in range(3):
        gradients = [rng.normal(size=s).astype(np.float32) for s in shapes]
        old = {v.name: v.numpy() for v in compressor.step_state_variables}
        payload, update = compressor.compress(
            [tf.constant(g) for g in gradients], tf.constant(step, tf.int64)
        )
        sent, _ = compressor.decompress(payload, tf.size(payload)[tf.newaxis], tf.constant(1))
        compressor.apply_state(update)
        state = {v.name: v for v in compressor.step_state_variables}
        residual = compressor.unflatten(state["compression_residual:0"])
        old_residual = compressor.unflatten(old["compression_residual:0"])
        if prune == "dgc":  # what is accumulated is the momentum, not the gradient
            old_momentum = compressor.unflatten(old["compression_momentum:0"])
            gradients = [0.9 * m.numpy() + g for m, g in zip(old_momentum, gradients, strict=True)]
        for i in range(len(shapes)):
            np.testing.assert_allclose(
                sent[i].numpy() + residual[i].numpy(),
                gradients[i] + old_residual[i].numpy(),
                atol=1e-5,
            )
        kept = sum(int(np.count_nonzero(s.numpy())) for s in sent[:2])
        assert 0.5 * 0.01 * 58_080 <= kept <= 2 * 0.01 * 58_080
