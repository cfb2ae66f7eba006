"""PowerSGD (Vogels et al., NeurIPS 2019): rank-r factors of each gradient matrix, two sums.

Per step, for each pruned tensor viewed as a matrix M (n x m; error feedback adds the
residual first) and its shared warm-start Q (m x r)::

    round 1   P = M Q                     allreduce P (with the dense-sent tensors)
              P^ = orthonormal basis of sum(P)     (the same on every rank)
    round 2   Q' = M^T P^                 allreduce Q'
              average = P^ (sum(Q') / N)^T
              residual = M - P^ Q'^T      (what this rank's factors left out)
              Q <- sum(Q') / N            (next step's warm start, the same on every rank)

Both rounds are sums of fixed-length float vectors: per-device traffic is about twice
(n + m) r floats per matrix whatever the number of ranks, against n m for dense. The price is
a second collective per step (the first's result is needed to compute the second's payload).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import tensorflow as tf

from globaldl.compression.base import check_range, check_type
from globaldl.compression.layout import FlatLayout
from globaldl.compression.quantizer import Quantizer
from globaldl.compression.sparsifier import SPARSIFIERS, Sparsifier
from globaldl.compression.summable import SumEncoding

MAX_RANK = 64


@SPARSIFIERS.register
class PowerSGD(Sparsifier):
    """Low-rank step 1: sends rank-``rank`` factors of each pruned tensor (see the module)."""

    name = "powersgd"
    agreed_indices = True
    low_rank: ClassVar[bool] = True

    def __init__(self, rank: int = 2) -> None:  # noqa: D107
        check_type("rank", rank, int)
        check_range("rank", rank, 1, MAX_RANK)
        self.rank = rank

    def get_config(self):  # noqa: D102
        return {"rank": self.rank}

    @classmethod
    def from_compression_config(cls, config, num_ranks=1):  # noqa: D102
        return cls(rank=config.powersgd_rank)

    def select(self, magnitudes, num_kept, seed):  # noqa: D102
        raise NotImplementedError("PowerSGD sends low-rank factors, not selected entries")


class LowRankPath:
    """The two rounds of PowerSGD over a flat layout (pruned tensors low-rank, the rest whole).

    Args:
        layout: the flat layout (its pruned tensors are the matrices).
        quantizer: encodes the float factors (none, or fp16 for half the bytes).
        rank: r; a matrix narrower than r uses its own width.
        num_ranks: ranks whose payloads are summed.

    """

    def __init__(self, layout: FlatLayout, quantizer: Quantizer, rank: int, num_ranks: int):
        self.layout = layout
        self.shapes = []  # (n, m, r) of each pruned tensor, in layout order
        for info in layout.sparse_infos:
            columns = info.shape[-1] if len(info.shape) >= 2 else 1
            rows = info.size // columns
            self.shapes.append((rows, columns, min(rank, rows, columns)))
        p_values = sum(n * r for n, _, r in self.shapes)
        q_values = sum(m * r for _, m, r in self.shapes)
        self.basis_elements = q_values
        first = quantizer.sum_encoding(num_ranks, np.zeros(p_values + layout.dense_elements), 1)
        second = quantizer.sum_encoding(num_ranks, np.zeros(q_values), 1)
        if first is None or second is None or first.uses_scales:
            raise ValueError(
                "prune='powersgd' sends float factors that must add up across ranks: "
                f"quantize={quantizer.name!r} cannot; use none or fp16"
            )
        self.encodings: tuple[SumEncoding, SumEncoding] = (first, second)
        self.dtype = first.dtype
        self.p_elements = p_values
        element_bytes = tf.as_dtype(self.dtype).size
        self.round_bytes = tuple(e.payload_elements * element_bytes for e in self.encodings)

    def initial_basis(self, seed: int) -> np.ndarray:
        """Q before the first step: standard normal, from the shared seed (alike on all ranks)."""
        return np.random.default_rng(seed).standard_normal(self.basis_elements).astype(np.float32)

    def _matrices(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """The pruned part of a flat vector as one n x m matrix per tensor."""
        return [
            tf.reshape(flat[info.offset : info.offset + info.size], [n, m])
            for info, (n, m, _) in zip(self.layout.sparse_infos, self.shapes, strict=True)
        ]

    def _split(self, flat: tf.Tensor, rows_of: int) -> list[tf.Tensor]:
        """A concatenation of factors (P: rows n, Q: rows m) back into matrices."""
        sizes = [shape[rows_of] * shape[2] for shape in self.shapes]
        pieces = tf.split(flat, sizes) if sizes else []
        return [
            tf.reshape(piece, [shape[rows_of], shape[2]])
            for piece, shape in zip(pieces, self.shapes, strict=True)
        ]

    def encode_first(
        self, accumulated: tf.Tensor, nonfinite: tf.Tensor, basis: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Round 1's payload (P = M Q of each matrix, then the dense-sent entries).

        Also returns the dense entries as receivers will decode them (error feedback).
        """
        factors = [
            tf.reshape(tf.matmul(matrix, q), [-1])
            for matrix, q in zip(self._matrices(accumulated), self._split(basis, 1), strict=True)
        ]
        dense = accumulated[self.layout.sparse_elements :]
        values = tf.concat([*factors, dense], axis=0)
        payload, reconstruction = self.encodings[0].encode(values, nonfinite, None)
        return payload, reconstruction[self.p_elements :]

    def encode_second(
        self, summed_first: tf.Tensor, accumulated: tf.Tensor, num_ranks: int | tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """Round 2's payload from round 1's sum.

        Returns the payload (Q' = M^T P^ of each matrix), P^ and Q' (flat), the summed
        dense entries and whether any rank flagged NaN/Inf.
        """
        decoded = self.encodings[0].decode(summed_first, num_ranks, None)
        p_sums = self._split(decoded.values[: self.p_elements], 0)
        # An orthonormal basis of each summed P (reduced QR); scale-free, so sum or average
        # give the same basis, and every rank computes it from the same bytes.
        p_hats = [tf.linalg.qr(p)[0] for p in p_sums]
        q_locals = [
            tf.matmul(matrix, p_hat, transpose_a=True)
            for matrix, p_hat in zip(self._matrices(accumulated), p_hats, strict=True)
        ]
        q_flat = tf.concat([tf.reshape(q, [-1]) for q in q_locals], axis=0) if q_locals else []
        q_flat = tf.reshape(tf.cast(q_flat, tf.float32), [-1])
        payload, q_sent = self.encodings[1].encode(q_flat, decoded.any_nonfinite, None)
        p_flat = tf.concat([tf.reshape(p, [-1]) for p in p_hats], axis=0) if p_hats else []
        p_flat = tf.reshape(tf.cast(p_flat, tf.float32), [-1])
        dense_sum = decoded.values[self.p_elements :]
        return payload, p_flat, q_sent, dense_sum, decoded.any_nonfinite

    def sent(self, p_hat: tf.Tensor, q_local: tf.Tensor, dense: tf.Tensor) -> tf.Tensor:
        """A rank's contribution as receivers see it, flat: P^ Q'^T per matrix, then dense."""
        products = [
            tf.reshape(tf.matmul(p, q, transpose_b=True), [-1])
            for p, q in zip(self._split(p_hat, 0), self._split(q_local, 1), strict=True)
        ]
        return tf.concat([*products, dense], axis=0)

    def decode(
        self,
        summed_second: tf.Tensor,
        p_hat: tf.Tensor,
        dense_sum: tf.Tensor,
        num_ranks: int | tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The sum over ranks (flat float32 [N]) and the next warm start (average Q')."""
        q_sum = self.encodings[1].decode(summed_second, num_ranks, None).values
        q_average = q_sum / tf.cast(num_ranks, tf.float32)
        summed = self.sent(p_hat, q_sum, dense_sum)
        return summed, q_average
