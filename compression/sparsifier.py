"""Step 1 of the compression: the sparsifier interface, its registry and the no-op."""

from __future__ import annotations

from typing import ClassVar

import tensorflow as tf

from globaldl.compression.base import Codec, Registry

EXCLUDED = -1.0
"""Magnitude marking an entry that must never be sent (its weight is pruned to zero)."""


def kept_count(size: int, density: float | tf.Tensor, cap: int | None = None) -> int | tf.Tensor:
    """How many of ``size`` entries a sparsifier keeps: round(density * size), at least 1.

    Rounds half up. A non-empty tensor always keeps at least one entry (so a tiny tensor or a
    tiny density never silences a layer for good); an empty tensor keeps none. ``cap`` (the
    entries left after weight pruning) bounds the count from above. Works on Python numbers
    (a static count) and on tensors (DGC's warm-up density changes with the epoch).
    """
    cap = size if cap is None else min(cap, size)
    if size == 0 or cap <= 0:
        return 0
    if isinstance(density, tf.Tensor):
        rounded = tf.cast(tf.floor(tf.cast(density, tf.float64) * size + 0.5), tf.int32)
        return tf.clip_by_value(rounded, 1, cap)
    return int(min(max(1, int(density * size + 0.5)), cap))


class Sparsifier(Codec):
    """Chooses which entries of one flattened gradient tensor are sent.

    A subclass sets ``name`` and ``fixed_count`` (True when ``select`` always returns exactly
    ``num_kept`` indices, which makes every payload the same size), declares
    ``agreed_indices`` (True when every rank selects the same indices at a step, from
    information all ranks share before it: the payloads can then be summed position by
    position) and ``sends_everything`` (True only for the no-op: no entry is pruned), and
    overrides

    * ``select(magnitudes, num_kept, seed) -> int32 indices``: ascending, distinct indices into
      ``magnitudes`` (a 1-D float32 tensor of |value|, holding ``EXCLUDED`` (-1) at entries
      that must never be chosen). ``num_kept`` is a Python int, or an int32 scalar tensor
      when ``density_at`` varies by epoch.

    It may override

    * ``density_at(density, epoch)``: the density to use in an epoch (DGC's warm-up);
    * ``accumulate(gradient, residual, momentum)`` and ``after_send(momentum, sent_mask)``:
      how the gradient, the unsent remainder and an optional momentum combine before
      selection (DGC's momentum correction and momentum factor masking). Set
      ``applies_momentum = True`` to get a momentum buffer.
    * ``score_priority(score)`` and ``update_score(score, averaged, sent_mask)``, with
      ``uses_shared_score = True``: selection then ranks a priority computed from a score
      (``score_rows`` x the pruned entries) every rank holds identically, instead of its own
      gradient; the compressor updates the score from each step's exchanged average and the
      positions sent. ``agreed_indices`` sparsifiers get a seed without the rank in it, so
      their random draws agree too.

    Example::

        @SPARSIFIERS.register
        class Largest(Sparsifier):
            name = "largest"
            def select(self, magnitudes, num_kept, seed):
                return tf.sort(tf.math.top_k(magnitudes, num_kept).indices)
    """

    fixed_count: ClassVar[bool] = True
    agreed_indices: ClassVar[bool] = False
    sends_everything: ClassVar[bool] = False
    applies_momentum: ClassVar[bool] = False
    uses_warmup: ClassVar[bool] = False
    uses_shared_score: ClassVar[bool] = False
    score_rows: ClassVar[int] = 0
    low_rank: ClassVar[bool] = False  # sends factors, not entries (PowerSGD): two rounds

    def select(
        self, magnitudes: tf.Tensor, num_kept: int | tf.Tensor, seed: tf.Tensor
    ) -> tf.Tensor:
        """Ascending int32 indices of the entries to send."""
        raise NotImplementedError(f"{type(self).__name__} must override select")

    def density_at(self, density: float, epoch: tf.Tensor) -> float | tf.Tensor:
        """The density in force during ``epoch`` (default: ``density`` throughout)."""
        return density

    def accumulate(
        self, gradient: tf.Tensor, residual: tf.Tensor | None, momentum: tf.Tensor | None
    ) -> tuple[tf.Tensor, tf.Tensor | None]:
        """What selection looks at, and the new momentum (default: gradient + residual)."""
        return (gradient if residual is None else gradient + residual), momentum

    def after_send(self, momentum: tf.Tensor, sent_mask: tf.Tensor) -> tf.Tensor:
        """The momentum after the entries in ``sent_mask`` were sent (default: unchanged)."""
        return momentum

    def score_priority(self, score: tf.Tensor) -> tf.Tensor:
        """What selection ranks in one tensor, from its part of the shared score."""
        raise NotImplementedError(f"{type(self).__name__} uses no shared score")

    def update_score(
        self, score: tf.Tensor, averaged: tf.Tensor, sent_mask: tf.Tensor
    ) -> tf.Tensor:
        """The shared score after a step that sent ``sent_mask`` and averaged ``averaged``."""
        raise NotImplementedError(f"{type(self).__name__} uses no shared score")

    @classmethod
    def from_compression_config(cls, config: object, num_ranks: int = 1) -> Sparsifier:
        """Build from a :class:`~globaldl.compression.CompressionConfig` (default: no settings)."""
        return cls()


SPARSIFIERS: Registry[Sparsifier] = Registry("sparsifier", Sparsifier)


@SPARSIFIERS.register
class NoPruning(Sparsifier):
    """Sends every entry (except those excluded by weight pruning)."""

    name = "none"
    agreed_indices = True
    sends_everything = True

    def select(self, magnitudes, num_kept, seed):  # noqa: D102
        return tf.cast(tf.where(magnitudes >= 0.0)[:, 0], tf.int32)
