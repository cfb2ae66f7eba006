"""Sparsifiers whose positions every rank agrees on before the step, so payloads can be summed."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from globaldl.compression import CompressionConfig, GradientCompressor, SharedTopK
from globaldl.compression.sparsifier import EXCLUDED

SHAPES = [(50, 40), (12,)]


def make(prune: str, ranks: int = 3, **settings) -> list[GradientCompressor]:
    config = CompressionConfig(prune=prune, quantize="none", density=0.02, **settings)
    return [
        GradientCompressor(
            config,
            [tf.Variable(tf.zeros(s)) for s in SHAPES],
            steps_per_epoch=10,
            rank=rank,
            num_ranks=ranks,
        )
        for rank in range(ranks)
    ]


def positions(compressor: GradientCompressor, step: int, seed: int) -> np.ndarray:
    gradients = [np.random.default_rng(seed).normal(size=s).astype(np.float32) for s in SHAPES]
    _, update = compressor.compress([tf.constant(g) for g in gradients], tf.constant(step))
    return update.carry[0].numpy()


def test_shared_randomk_draws_the_same_k_positions_on_every_rank_whatever_their_gradients():
    compressors = make("shared-randomk")
    first = [positions(c, 5, seed=rank) for rank, c in enumerate(compressors)]
    assert all(np.array_equal(first[0], p) for p in first[1:])
    assert first[0].size == 40 and np.unique(first[0]).size == 40  # 2% of 2000, distinct
    assert not np.array_equal(first[0], positions(compressors[0], 6, seed=0))  # a new draw
    assert compressors[0].wire_spec.combine.value == "sum"


def test_shared_topk_takes_the_top_of_the_score_and_explores_the_rest_numpy_reference():
    rng = np.random.default_rng(0)
    magnitudes = np.abs(rng.normal(size=500)).astype(np.float32)
    magnitudes[[3, 77, 200]] = EXCLUDED  # weights pruned to zero: never chosen
    selector = SharedTopK(explore_fraction=0.3)
    chosen = selector.select(tf.constant(magnitudes), 20, tf.constant([1, 2], tf.int64)).numpy()
    top = np.argsort(-magnitudes)[:14]  # (1 - 0.3) * 20 from the top
    assert set(top) <= set(chosen)
    assert chosen.size == 20 and np.all(np.diff(chosen) > 0)
    assert not {3, 77, 200} & set(chosen)
    again = selector.select(tf.constant(magnitudes), 20, tf.constant([1, 2], tf.int64)).numpy()
    np.testing.assert_array_equal(chosen, again)  # same shared seed, same draw


def test_shared_topk_score_estimates_each_entrys_backlog_numpy_reference():
    rng = np.random.default_rng(1)
    rate = np.where(rng.random(300) < 0.5, 0.0, rng.random(300)).astype(np.float32)
    age = rng.integers(0, 9, size=300).astype(np.float32)
    averaged = rng.normal(size=300).astype(np.float32)
    sent = rng.random(300) < 0.3
    selector = SharedTopK()
    new = selector.update_score(
        tf.constant(np.stack([rate, age])), tf.constant(averaged), tf.constant(sent)
    ).numpy()
    fresh = np.abs(averaged) / (age + 1)  # one step's worth of the fleet's mean gradient
    expected_rate = np.where(sent, np.where(rate > 0, (rate + fresh) / 2, fresh), rate)
    np.testing.assert_allclose(new[0], expected_rate, rtol=1e-6)
    np.testing.assert_array_equal(new[1], np.where(sent, 0.0, age + 1))
    priority = selector.score_priority(tf.constant(new)).numpy()
    prior = new[0][new[0] > 0].mean()  # an entry never sent: the tensor's mean rate
    expected = np.where(new[0] > 0, new[0], prior) * (new[1] + 1)
    np.testing.assert_allclose(priority, expected, rtol=1e-5)


def test_shared_topk_ranks_alike_on_every_rank_from_the_exchanged_averages():
    compressors = make("shared-topk", explore_fraction=0.25)
    rng = np.random.default_rng(4)
    for step in range(3):
        payloads, updates = [], []
        for compressor in compressors:
            gradients = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
            payload, update = compressor.compress(
                [tf.constant(g) for g in gradients], tf.constant(step)
            )
            payloads.append(payload)
            updates.append(update)
        chosen = updates[0].carry[0].numpy()
        assert all(np.array_equal(chosen, u.carry[0].numpy()) for u in updates)
        before = compressors[0].shared_state_variables[0].numpy()
        if step > 0:  # the top 75% of k are the largest predicted backlogs of the first tensor
            backlog = SharedTopK().score_priority(tf.constant(before)).numpy()
            threshold = np.sort(backlog)[-30]  # ties at it are broken by the shared draw
            assert set(np.flatnonzero(backlog > threshold)) <= set(chosen)
            assert np.sum(backlog[chosen] >= threshold) >= 30
        for compressor, update in zip(compressors, updates, strict=True):
            averaged, _, final = compressor.decompress_update(
                tf.add_n(payloads), None, len(compressors), update
            )
            compressor.apply_state(final)
        flat_average = np.concatenate([a.numpy().ravel() for a in averaged])[:2000]
        sent = np.zeros(2000, bool)
        sent[chosen] = True
        expected = SharedTopK().update_score(
            tf.constant(before), tf.constant(flat_average), tf.constant(sent)
        )
        for compressor in compressors:
            np.testing.assert_array_equal(
                compressor.shared_state_variables[0].numpy(), expected.numpy()
            )
