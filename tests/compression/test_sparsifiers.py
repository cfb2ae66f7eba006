"""Sparsifiers against NumPy references, and the measured error of the sampled threshold."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from globaldl.compression import DGC, RandomK, Threshold, TopK
from globaldl.compression.sparsifier import EXCLUDED, kept_count
from globaldl.compression.threshold import sample_elements


def seed(value: int) -> tf.Tensor:
    return tf.constant([value, 99], tf.int64)


def test_kept_count_rounds_half_up_keeps_at_least_one_and_respects_the_cap():
    assert kept_count(1000, 0.0015) == 2
    assert kept_count(1000, 0.0014) == 1
    assert kept_count(10, 1e-9) == 1  # density rounding to zero still keeps one entry
    assert kept_count(1, 0.001) == 1  # a scalar
    assert kept_count(0, 0.5) == 0  # an empty tensor keeps nothing
    assert kept_count(100, 0.5, cap=10) == 10
    assert int(kept_count(1000, tf.constant(0.0015, tf.float64))) == 2
    assert int(kept_count(10, tf.constant(1e-9, tf.float64))) == 1


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3000), st.data())
def test_topk_keeps_exactly_the_k_largest_magnitudes(size, data):
    k = data.draw(st.integers(1, size))
    rng = np.random.default_rng(size)
    magnitudes = rng.permutation(size).astype(np.float32) * 0.25  # distinct
    chosen = TopK().select(tf.constant(magnitudes), k, seed(0)).numpy()
    np.testing.assert_array_equal(chosen, np.sort(np.argsort(-magnitudes)[:k]))


def test_topk_never_selects_an_excluded_entry():
    magnitudes = np.arange(100, dtype=np.float32)
    magnitudes[50:] = EXCLUDED  # the largest half is pruned away
    chosen = TopK().select(tf.constant(magnitudes), 50, seed(0)).numpy()
    np.testing.assert_array_equal(chosen, np.arange(50))


def test_randomk_keeps_exactly_k_distinct_allowed_entries_and_varies_with_the_seed():
    magnitudes = np.ones(1000, np.float32)
    magnitudes[::3] = EXCLUDED
    draws = [RandomK().select(tf.constant(magnitudes), 40, seed(s)).numpy() for s in range(30)]
    for chosen in draws:
        assert len(chosen) == 40 and len(np.unique(chosen)) == 40
        assert np.all(np.diff(chosen) > 0)
        assert np.all(magnitudes[chosen] != EXCLUDED)
    assert not np.array_equal(draws[0], draws[1])
    covered = np.unique(np.concatenate(draws))
    assert len(covered) > 0.5 * 667  # spread over the allowed entries, not stuck on a few


def test_randomk_draws_k_positions_without_a_pass_over_the_tensor(monkeypatch):
    def whole_tensor(*args):
        raise AssertionError("fell back to a priority per entry")

    monkeypatch.setattr(RandomK, "_by_priority", staticmethod(whole_tensor))
    magnitudes = tf.ones([48_000])
    for s in range(20):
        chosen = RandomK().select(magnitudes, 480, seed(s)).numpy()
        assert len(np.unique(chosen)) == 480 and np.all(np.diff(chosen) > 0)


def test_randomk_picks_every_entry_equally_often():
    size, k, draws = 1000, 50, 400
    counts = np.zeros(size)
    select = tf.function(lambda s: RandomK().select(tf.ones([size]), k, s), autograph=False)
    for s in range(draws):
        counts[select(seed(s)).numpy()] += 1
    expected = draws * k / size  # 20 per entry
    chi_square = np.sum((counts - expected) ** 2 / expected)
    # 999 degrees of freedom: mean 999, standard deviation about 45 (bounds at 5 sd)
    assert 999 - 225 < chi_square < 999 + 225, chi_square


def test_randomk_falls_back_to_a_full_draw_when_most_entries_are_excluded():
    magnitudes = np.full(10_000, EXCLUDED, np.float32)
    allowed = np.random.default_rng(4).choice(10_000, 300, replace=False)
    magnitudes[allowed] = 1.0
    for s in range(5):
        chosen = RandomK().select(tf.constant(magnitudes), 100, seed(s)).numpy()
        assert len(np.unique(chosen)) == 100
        assert np.all(magnitudes[chosen] == 1.0)


def test_small_tensors_use_an_exact_threshold():
    assert sample_elements(65_536, 0.01, 16_384) == 65_536
    assert sample_elements(200_000, 0.01, 16_384) == 16_384
    assert sample_elements(10_000_000, 0.01, 16_384) == 100_000
    magnitudes = np.random.default_rng(1).permutation(50_000).astype(np.float32)
    chosen = Threshold().select(tf.constant(magnitudes), 500, seed(0)).numpy()
    np.testing.assert_array_equal(chosen, np.sort(np.argsort(-magnitudes)[:500]))


def test_threshold_never_sends_zeros():
    magnitudes = np.zeros(100_000, np.float32)
    magnitudes[:10] = 1.0
    chosen = Threshold().select(tf.constant(magnitudes), 1000, seed(0)).numpy()
    np.testing.assert_array_equal(chosen, np.arange(10))


@pytest.mark.parametrize(
    ("density", "low", "high"),
    # Bounds stated in Threshold's docstring (extremes over 400 measured draws), with margin.
    [(0.01, 0.75, 1.35), (0.001, 0.40, 2.0)],
)
def test_threshold_sampling_error_is_within_the_stated_bound(density, low, high):
    size = 200_000
    magnitudes = tf.constant(np.abs(np.random.default_rng(2).laplace(size=size)).astype(np.float32))
    k = kept_count(size, density)
    select = tf.function(lambda m, s: Threshold().select(m, k, s), autograph=False)
    ratios = np.array([int(tf.size(select(magnitudes, seed(s)))) / k for s in range(30)])
    assert low <= ratios.min() and ratios.max() <= high, ratios
    assert 0.85 <= ratios.mean() <= 1.15, ratios.mean()
    assert ratios.std() > 0  # really sampled, not exact


@pytest.mark.parametrize("density", [0.01, 0.001])
def test_dgc_sampled_selection_is_the_exact_top_k(density):
    size = 200_000
    values = np.abs(np.random.default_rng(3).normal(size=size)).astype(np.float32)
    k = kept_count(size, density)
    exact = np.sort(np.argsort(-values)[:k])
    select = tf.function(lambda m, s: DGC().select(m, k, s), autograph=False)
    for s in range(15):
        np.testing.assert_array_equal(select(tf.constant(values), seed(s)).numpy(), exact)
