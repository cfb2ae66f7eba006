"""PowerSGD as a codec: two summed rounds, against a NumPy reference of the algorithm."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from globaldl.compression import CompressionConfig, GradientCompressor
from globaldl.exchange import check_wire_spec

SHAPES = [(30, 20), (3, 3, 4, 8), (10,)]  # two matrices (30x20, 36x8), one bias sent whole
RANKS = 3


def make(quantize: str = "none", rank: int = 2) -> list[GradientCompressor]:
    config = CompressionConfig(
        prune="powersgd", quantize=quantize, powersgd_rank=rank, dense_below_elements=100
    )
    return [
        GradientCompressor(
            config,
            [tf.Variable(tf.zeros(s)) for s in SHAPES],
            steps_per_epoch=10,
            rank=r,
            num_ranks=RANKS,
        )
        for r in range(RANKS)
    ]


def run_step(compressors, gradients, step):
    """Both rounds, summed as allreduce would; every rank's final update."""
    firsts = [
        c.compress([tf.constant(g) for g in grads], tf.constant(step))
        for c, grads in zip(compressors, gradients, strict=True)
    ]
    first_sum = tf.add_n([payload for payload, _ in firsts])
    seconds = [
        c.next_round(1, first_sum, RANKS, update)
        for c, (_, update) in zip(compressors, firsts, strict=True)
    ]
    second_sum = tf.add_n([payload for payload, _ in seconds])
    return [
        c.decompress_update(second_sum, None, RANKS, update)
        for c, (_, update) in zip(compressors, seconds, strict=True)
    ]


def test_powersgd_declares_two_summed_rounds_of_factor_sizes() -> None:
    spec = check_wire_spec(make()[0].wire_spec)
    assert spec.combine.value == "sum" and spec.dtype == "float32"
    # P: (30 + 36) x 2 floats plus the 10-entry bias and the flag; Q: (20 + 8) x 2 and the flag
    assert spec.round_bytes == (4 * (66 * 2 + 10 + 1), 4 * (28 * 2 + 1))
    half = check_wire_spec(make("fp16")[0].wire_spec)
    assert half.dtype == "float16" and half.round_bytes == (2 * 143, 2 * 57)
    with pytest.raises(ValueError, match="prune='powersgd' sends float factors.*'int8'"):
        make("int8")


def test_powersgd_matches_the_numpy_reference_and_keeps_what_it_left_out() -> None:
    compressors = make()
    rng = np.random.default_rng(0)
    gradients = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(RANKS)]
    basis = compressors[0].shared_state_variables[0].numpy()  # Q of both matrices, shared
    results = run_step(compressors, gradients, 0)

    # NumPy reference (Vogels et al. 2019, Algorithm 1 with error feedback, zero residual)
    matrices = [[g[0].reshape(30, 20), g[1].reshape(36, 8)] for g in gradients]
    qs = [basis[:40].reshape(20, 2), basis[40:].reshape(8, 2)]
    expected_average, expected_sent = [], [[] for _ in range(RANKS)]
    for index, q in enumerate(qs):
        p_sum = sum(m[index] @ q for m in matrices)
        p_hat = np.linalg.qr(p_sum)[0]
        q_ranks = [m[index].T @ p_hat for m in matrices]
        expected_average.append(p_hat @ (sum(q_ranks) / RANKS).T)
        for rank in range(RANKS):
            expected_sent[rank].append(p_hat @ q_ranks[rank].T)
    for averaged, nonfinite, _ in results:
        assert not bool(nonfinite)
        np.testing.assert_allclose(averaged[0].numpy(), expected_average[0], atol=1e-4)
        np.testing.assert_allclose(
            averaged[1].numpy().reshape(36, 8), expected_average[1], atol=1e-4
        )
        # the bias went whole: its average is exact
        np.testing.assert_allclose(
            averaged[2].numpy(), np.mean([g[2] for g in gradients], axis=0), atol=1e-6
        )
    for rank, (compressor, (_, _, update)) in enumerate(zip(compressors, results, strict=True)):
        compressor.apply_state(update)
        residual = compressor.unflatten(compressor.local_state_variables[0])
        # error feedback: residual = M - P^ Q_rank^T (the sign of P^'s columns cancels out)
        np.testing.assert_allclose(
            residual[0].numpy(), matrices[rank][0] - expected_sent[rank][0], atol=1e-4
        )
        assert np.all(residual[2].numpy() == 0.0)
    # the next warm start is the average Q', identical on every rank
    for compressor in compressors[1:]:
        np.testing.assert_array_equal(
            compressor.shared_state_variables[0].numpy(),
            compressors[0].shared_state_variables[0].numpy(),
        )


def test_a_gradient_matrix_of_rank_r_is_sent_exactly_after_one_step() -> None:
    compressors = make(rank=2)
    rng = np.random.default_rng(1)
    low = rng.normal(size=(30, 2)) @ rng.normal(size=(2, 20))
    gradients = [
        [low.astype(np.float32), np.zeros(SHAPES[1], np.float32), np.ones(10, np.float32)]
        for _ in range(RANKS)
    ]
    (averaged, _, _), *_ = run_step(compressors, gradients, 0)
    np.testing.assert_allclose(averaged[0].numpy(), low, atol=1e-4)
