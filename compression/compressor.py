"""GradientCompressor: all of a model's gradients into one payload per round, and back."""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from globaldl.compression.base import TensorInfo, check_range, check_type
from globaldl.compression.config import CompressionConfig
from globaldl.compression.gather_path import GatherPath
from globaldl.compression.layout import FlatLayout
from globaldl.compression.powersgd import LowRankPath
from globaldl.compression.quantizer import QUANTIZERS, Quantizer
from globaldl.compression.selection import fold_seed, select_positions
from globaldl.compression.sparsifier import SPARSIFIERS, Sparsifier
from globaldl.compression.state import LOCAL_STATE, CompressorState, StateUpdate
from globaldl.compression.sum_path import SumPath
from globaldl.compression.weight_pruning import WeightPruning
from globaldl.compression.wire_spec import Combine, WireSpec

SELECT_SALT = 1
SHARED_STREAM = -1
"""Stands in for the rank in the seed of draws every rank must make alike."""

# Every branch and loop here is on static Python values (tf.cond where a tensor decides), so
# AutoGraph has nothing to convert; skipping it makes tracing the trainer's step much faster.
_plain_python = tf.autograph.experimental.do_not_convert


class GradientCompressor:
    """Compresses ALL gradients of a model into ONE payload per round (one collective each).

    Per step, on every rank::

        payload, update = compressor.compress(gradients, step)          # phase: compress
        exchanged = <collective of payload, as compressor.wire_spec says> # phase: exchange
        averaged, any_nonfinite, update = compressor.decompress_update(
            exchanged, lengths, num_ranks, update)                       # phase: decompress
        if not any_nonfinite:                                            # phase: apply
            optimizer.apply_gradients(zip(averaged, variables))
            compressor.apply_state(update)
            compressor.apply_weight_masks()
            compressor.update_weight_masks(step)

    (``decompress(exchanged, lengths, num_ranks)`` returns the first two and drops the state:
    enough for codecs without shared state.)

    Layout: gradients are cast to float32 and laid out in one flat vector, the pruned
    ("sparse") tensors first, then the tensors sent dense (fewer than
    ``config.dense_below_elements`` entries, or every tensor when nothing is pruned).

    How payloads combine follows from the codecs' declarations, never their names, and is
    published as ``wire_spec`` for the exchange: SUM when every rank sends the same positions
    (``Sparsifier.agreed_indices``) and the quantizer's values add up
    (``Quantizer.sum_encoding``): one fixed-length vector, see :mod:`.sum_path`. GATHER
    otherwise: one uint8 buffer per rank, see :mod:`.wire`.

    With ``prune == "dgc"`` the momentum is applied here (``applies_momentum`` is True): the
    optimizer must then be plain SGD without momentum.

    Args:
        config: the settings, as the CLI built them.
        variables: the trainable variables, in the order gradients will be given.
        steps_per_epoch: for DGC's warm-up and the weight-pruning schedule.
        rank: this rank (varies the per-rank random draws).
        num_ranks: ranks whose payloads are combined (scales DGC's clip_norm, sizes the
            integer lanes of summed codes).

    Attributes:
        wire_spec: the declaration the exchange obeys.
        combine, payload_dtype, fixed_payload_bytes: the same, as attributes.
        raw_bytes_per_step: bytes of all gradients as dense float32.
        local_state_variables: this rank's own (error-feedback residual, DGC momentum).
        shared_state_variables: identical on every rank (weight masks, the shared scales of
            summed codes, shared top-k's score): broadcast with the weights.
        state_variables: both (everything to checkpoint).
        step_state_variables: the part a StateUpdate carries, in its order.
        applies_momentum: True for dgc (the optimizer must then run without momentum).
        tensor_infos: a TensorInfo per variable (offset in the flat layout, pruned or dense).

    """

    def __init__(
        self,
        config: CompressionConfig,
        variables: list[tf.Variable],
        steps_per_epoch: int,
        *,
        rank: int = 0,
        num_ranks: int = 1,
    ) -> None:
        if not isinstance(config, CompressionConfig):
            raise ValueError(f"config={config!r} must be a CompressionConfig")
        check_type("steps_per_epoch", steps_per_epoch, int)
        check_range("steps_per_epoch", steps_per_epoch, 1)
        check_type("rank", rank, int)
        check_range("rank", rank, 0)
        check_type("num_ranks", num_ranks, int)
        check_range("num_ranks", num_ranks, 1)
        self.config = config
        self.variables = list(variables)
        self.steps_per_epoch = steps_per_epoch
        self.rank = rank
        self.num_ranks = num_ranks
        self.sparsifier: Sparsifier = SPARSIFIERS.get_class(config.prune).from_compression_config(
            config, num_ranks
        )
        self.quantizer: Quantizer = QUANTIZERS.get_class(config.quantize).from_compression_config(
            config
        )
        self.weight_pruning: WeightPruning | None = None
        if config.weight_sparsity > 0.0:
            self.weight_pruning = WeightPruning(
                self.variables,
                config.weight_sparsity,
                begin_step=config.weight_pruning_begin_epoch * steps_per_epoch,
                end_step=config.weight_pruning_end_epoch * steps_per_epoch,
                frequency_steps=config.weight_pruning_frequency_steps,
            )
        self.layout = FlatLayout(
            self.variables,
            prunes=not self.sparsifier.sends_everything,
            dense_below_elements=config.dense_below_elements,
            density=config.density,
            weight_pruning=self.weight_pruning,
        )
        self._build_paths()
        self.lossless = self.sparsifier.sends_everything and self.quantizer.is_lossless
        self.applies_momentum = self.sparsifier.applies_momentum
        self.raw_bytes_per_step = 4 * self.num_elements
        self._build_state()

    # ------------------------------------------------------------------------ declarations
    def _build_paths(self) -> None:
        """Choose SUM or GATHER from the codecs' declarations; refuse what neither can carry."""
        layout = self.layout
        self.low_rank_path: LowRankPath | None = None
        self.sum_path: SumPath | None = None
        self.gather_path: GatherPath | None = None
        if self.sparsifier.low_rank:
            path = LowRankPath(layout, self.quantizer, self.sparsifier.rank, self.num_ranks)  # type: ignore[attr-defined]
            self.low_rank_path = path
            self._declare(Combine.SUM, path.dtype, path.round_bytes)
            return
        encoding = None
        if self.sparsifier.agreed_indices:
            value_groups = layout.sum_value_groups()
            groups = len(layout.sparse_infos) + len(layout.dense_infos)
            encoding = self.quantizer.sum_encoding(self.num_ranks, value_groups, groups)
        if encoding is not None:
            self.sum_path = SumPath(layout, encoding)
        else:
            if not self.quantizer.gatherable:
                agreed = [name for name in SPARSIFIERS.names if _agrees(name)]
                raise ValueError(
                    f"quantize={self.config.quantize!r} adds codes across ranks, so every rank "
                    f"must send the same positions; prune={self.config.prune!r} lets each "
                    f"rank choose its own. Use prune one of {agreed}"
                )
            self.gather_path = GatherPath(layout, self.quantizer, self.sparsifier.fixed_count)
        path = self.sum_path or self.gather_path
        combine = Combine.SUM if self.sum_path is not None else Combine.GATHER
        self._declare(combine, path.dtype, (path.fixed_bytes,))  # type: ignore[union-attr]

    def _declare(self, combine: Combine, dtype: str, round_bytes: tuple[int | None, ...]) -> None:
        self.combine = combine
        self.payload_dtype = tf.as_dtype(dtype)
        self.fixed_payload_bytes: int | None = round_bytes[0]
        self.wire_spec = WireSpec(combine=combine, dtype=dtype, round_bytes=round_bytes)

    def _build_state(self) -> None:
        state: dict[str, tf.Variable] = {}
        zeros = tf.zeros([self.num_elements])
        if self.config.error_feedback and not self.lossless:
            state["residual"] = tf.Variable(zeros, trainable=False, name="compression_residual")
        if self.applies_momentum:
            state["momentum"] = tf.Variable(zeros, trainable=False, name="compression_momentum")
        if self.sum_path is not None and self.sum_path.encoding.uses_scales:
            state["scales"] = tf.Variable(
                self.sum_path.encoding.initial_scales(), trainable=False, name="compression_scales"
            )
        if self.low_rank_path is not None:
            state["basis"] = tf.Variable(
                self.low_rank_path.initial_basis(self.config.seed),
                trainable=False,
                name="compression_basis",
            )
        if self.sparsifier.uses_shared_score:
            state["score"] = tf.Variable(
                tf.zeros([self.sparsifier.score_rows, self.sparse_elements]),
                trainable=False,
                name="compression_score",
            )
        masks = self.weight_pruning.mask_variables if self.weight_pruning else []
        self.state = CompressorState(state, masks)
        self.step_state_variables: list[tf.Variable] = self.state.step_variables
        self.local_state_variables: list[tf.Variable] = self.state.local
        self.shared_state_variables: list[tf.Variable] = self.state.shared
        self.state_variables: list[tf.Variable] = self.state.everything

    # ----------------------------------------------------------------- layout, for callers
    @property
    def tensor_infos(self) -> list[TensorInfo]:
        """A TensorInfo per variable, in variable order."""
        return self.layout.tensor_infos

    @property
    def sparse_infos(self) -> list[TensorInfo]:
        """The pruned tensors, in layout order."""
        return self.layout.sparse_infos

    @property
    def dense_infos(self) -> list[TensorInfo]:
        """The tensors sent dense, in layout order."""
        return self.layout.dense_infos

    @property
    def num_elements(self) -> int:
        """Entries of all gradients."""
        return self.layout.num_elements

    @property
    def sparse_elements(self) -> int:
        """Entries of the pruned tensors (the first part of the layout)."""
        return self.layout.sparse_elements

    @property
    def dense_elements(self) -> int:
        """Entries of the tensors sent dense (the second part)."""
        return self.layout.dense_elements

    @property
    def wire(self) -> Any:
        """The gathered buffer's format (GATHER only)."""
        if self.gather_path is None:
            raise AttributeError("a summed payload has no gathered wire format")
        return self.gather_path.wire

    # --------------------------------------------------------------------------------- compress
    @_plain_python
    def compress(
        self, gradients: list[tf.Tensor | None], step: tf.Tensor
    ) -> tuple[tf.Tensor, StateUpdate]:
        """Return this rank's payload for ``gradients`` at global ``step``, and the state it leaves.

        The payload is what ``wire_spec`` declares: a summable vector (values, the NaN/Inf
        flag, counters) or one uint8 buffer. A rank whose gradients hold NaN/Inf sends zeros
        and its flag. Changes no variable: the new state comes back in the StateUpdate (the
        old local state when the gradients were not finite).
        """
        if len(gradients) != len(self.variables):
            raise ValueError(f"got {len(gradients)} gradients for {len(self.variables)} variables")
        step = tf.cast(step, tf.int64)
        state = self.state.read()
        gradient, nonfinite = self.layout.flatten(gradients)
        keep = self.layout.keep_mask()
        accumulated, new_momentum = self.sparsifier.accumulate(
            gradient, state.get("residual"), state.get("momentum")
        )
        if keep is not None:
            accumulated = tf.where(keep, accumulated, 0.0)
            if new_momentum is not None:
                new_momentum = tf.where(keep, new_momentum, 0.0)
        # A rank whose gradients are not finite sends zeros (and its flag).
        accumulated = tf.where(nonfinite, tf.zeros_like(accumulated), accumulated)

        if self.low_rank_path is not None:
            payload, dense_sent = self.low_rank_path.encode_first(
                accumulated, nonfinite, state["basis"]
            )
            return payload, self.state.update(state, (accumulated, dense_sent, nonfinite))

        seed = self._seed(step, self.rank)
        selection_seed = self._seed(step, SHARED_STREAM) if self.sparsifier.agreed_indices else seed
        density: float | tf.Tensor = self.config.density
        if self.sparsifier.uses_warmup:
            density = self.sparsifier.density_at(self.config.density, step // self.steps_per_epoch)
        positions = select_positions(
            self.sparsifier,
            self.layout,
            self._shared_priority(state["score"]) if "score" in state else accumulated,
            keep,
            density,
            fold_seed(selection_seed, SELECT_SALT),
        )
        if self.sum_path is not None:
            encoded = self.sum_path.encode(
                accumulated, positions, keep, nonfinite, state.get("scales")
            )
        else:
            encoded = self.gather_path.encode(accumulated, positions, keep, nonfinite, seed)  # type: ignore[union-attr]

        new_state = dict(state)
        if "residual" in state:
            new_state["residual"] = accumulated - encoded.sent
        if "momentum" in state:
            sent_mask = tf.scatter_nd(
                positions[:, tf.newaxis], tf.ones_like(positions, tf.bool), [self.num_elements]
            )
            new_state["momentum"] = self.sparsifier.after_send(new_momentum, sent_mask)
        for name in LOCAL_STATE:
            if name in state:
                new_state[name] = tf.where(nonfinite, state[name], new_state[name])
        return encoded.payload, self.state.update(new_state, (positions,))

    def _shared_priority(self, score: tf.Tensor) -> tf.Tensor:
        """What shared selection ranks, tensor by tensor, from the shared score."""
        if not self.sparse_infos:
            return tf.zeros([0])
        return tf.concat(
            [
                self.sparsifier.score_priority(score[:, info.offset : info.offset + info.size])
                for info in self.sparse_infos
            ],
            axis=0,
        )

    def _seed(self, step: tf.Tensor, stream: int) -> tf.Tensor:
        base = tf.constant([self.config.seed, stream], tf.int64)
        return tf.random.experimental.stateless_fold_in(base, step)

    @_plain_python
    def next_round(
        self,
        round_index: int,
        exchanged: tf.Tensor,
        num_ranks: int | tf.Tensor,
        update: StateUpdate,
    ) -> tuple[tf.Tensor, StateUpdate]:
        """The payload of round ``round_index`` (>= 1) from the previous round's sum.

        Only for compressors whose ``wire_spec`` declares more than one round (PowerSGD).
        """
        if self.low_rank_path is None or round_index != 1:
            raise ValueError(
                f"round {round_index}: this compressor declares {self.wire_spec.rounds} round(s)"
            )
        accumulated, dense_sent, nonfinite = update.carry
        path = self.low_rank_path
        payload, p_hat, q_sent, dense_sum, any_nonfinite = path.encode_second(
            exchanged, accumulated, num_ranks
        )
        new_state = self.state.named(update)
        if "residual" in new_state:
            residual = accumulated - path.sent(p_hat, q_sent, dense_sent)
            new_state["residual"] = tf.where(nonfinite, new_state["residual"], residual)
        return payload, self.state.update(new_state, (p_hat, dense_sum, any_nonfinite))

    # ------------------------------------------------------------------------------- decompress
    @_plain_python
    def decompress_update(
        self,
        exchanged: tf.Tensor,
        lengths: tf.Tensor | None,
        num_ranks: int | tf.Tensor,
        update: StateUpdate | None,
    ) -> tuple[list[tf.Tensor], tf.Tensor, StateUpdate | None]:
        """The AVERAGED float32 gradients, whether any rank was nonfinite, and the final update.

        SUM: ``exchanged`` is the elementwise sum of every rank's payload (``lengths`` unused).
        GATHER: the concatenation of every rank's buffer in rank order, ``lengths`` the length
        of each (may be None when ``fixed_payload_bytes`` is set). Ranks that flagged NaN/Inf
        contribute zeros, so the result stays finite; the trainer should skip the step.
        ``update`` (compress's) comes back with the shared state this exchange decided: the
        next scales, the next score.
        """
        if self.gather_path is not None:
            summed, any_nonfinite = self.gather_path.decode(exchanged, lengths, num_ranks)
            averaged = summed / tf.cast(num_ranks, tf.float32)
            return self.unflatten(averaged), any_nonfinite, update
        if self.low_rank_path is not None:
            if update is None or len(update.carry) != 3:
                raise ValueError("PowerSGD decodes its second round with next_round's StateUpdate")
            p_hat, dense_sum, any_nonfinite = update.carry
            summed, basis = self.low_rank_path.decode(exchanged, p_hat, dense_sum, num_ranks)
            update = self.state.replace(update, basis=basis)
            averaged = summed / tf.cast(num_ranks, tf.float32)
            return self.unflatten(averaged), any_nonfinite, update
        if update is None and self.sparse_infos:
            raise ValueError(
                "a summed payload of pruned tensors decodes with the positions compress chose: "
                "call decompress_update with compress's StateUpdate"
            )
        positions = update.carry[0] if update is not None else tf.zeros([0], tf.int32)
        scales = self.state.read()["scales"] if "scales" in self.state else None
        summed, decoded = self.sum_path.decode(exchanged, positions, num_ranks, scales)  # type: ignore[union-attr]
        averaged = summed / tf.cast(num_ranks, tf.float32)
        if update is not None:
            decided = {} if decoded.scales is None else {"scales": decoded.scales}
            if "score" in self.state:
                sent_mask = tf.scatter_nd(
                    positions[:, tf.newaxis],
                    tf.ones_like(positions, tf.bool),
                    [self.sparse_elements],
                )
                decided["score"] = self.sparsifier.update_score(
                    self.state.named(update)["score"], averaged[: self.sparse_elements], sent_mask
                )
            update = self.state.replace(update, **decided)
        return self.unflatten(averaged), decoded.any_nonfinite, update

    @_plain_python
    def decompress(
        self, exchanged: tf.Tensor, lengths: tf.Tensor | None, num_ranks: int | tf.Tensor
    ) -> tuple[list[tf.Tensor], tf.Tensor]:
        """The averaged gradients and the NaN/Inf flag, without the state update."""
        averaged, any_nonfinite, _ = self.decompress_update(exchanged, lengths, num_ranks, None)
        return averaged, any_nonfinite

    @_plain_python
    def unflatten(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """Split a flat [N] vector in this compressor's layout into the variables' shapes.

        The layout puts pruned tensors first; residuals and momenta are stored in it.
        """
        return self.layout.unflatten(flat)

    # ------------------------------------------------------------------------------------ state
    @_plain_python
    def apply_state(self, update: StateUpdate) -> None:
        """Assign the state a (successful) step leaves: residuals, momenta, shared scales."""
        self.state.apply(update)

    @_plain_python
    def wire_bytes(self, payload: tf.Tensor) -> tf.Tensor:
        """int64: bytes handed to the collective for ``payload`` (size * itemsize)."""
        return tf.cast(tf.size(payload), tf.int64) * payload.dtype.size

    # --------------------------------------------------------------------------- weight pruning
    @_plain_python
    def mask_gradients(self, gradients: list[tf.Tensor | None]) -> list[tf.Tensor | None]:
        """Gradients with pruned weights' entries zeroed (identity without weight pruning)."""
        if self.weight_pruning is None:
            return list(gradients)
        return self.weight_pruning.mask_gradients(gradients)

    @_plain_python
    def apply_weight_masks(self) -> None:
        """Zero the pruned weights; call right after the optimizer step (no-op when off)."""
        if self.weight_pruning is not None:
            self.weight_pruning.apply_masks()

    @_plain_python
    def update_weight_masks(self, step: tf.Tensor) -> tf.Tensor:
        """Recompute the masks if the schedule prunes at ``step``; bool: whether it did."""
        if self.weight_pruning is None:
            return tf.constant(False)
        return self.weight_pruning.update_masks(step)

    @_plain_python
    def weight_sparsity_at(self, step: tf.Tensor) -> tf.Tensor:
        """The scheduled weight sparsity (float32) at ``step`` (0 when off)."""
        if self.weight_pruning is None:
            return tf.constant(0.0)
        return self.weight_pruning.sparsity_at(step)

    # ----------------------------------------------------------------------------------- config
    def get_config(self) -> dict[str, Any]:
        """The settings and the static facts the exchange and the run summary report."""
        return {
            **self.config.get_config(),
            "steps_per_epoch": self.steps_per_epoch,
            "rank": self.rank,
            "num_ranks": self.num_ranks,
            "combine": self.combine.value,
            "raw_bytes_per_step": self.raw_bytes_per_step,
            "fixed_payload_bytes": self.fixed_payload_bytes,
            "sparse_elements": self.sparse_elements,
            "dense_elements": self.dense_elements,
        }

    def __repr__(self) -> str:
        return (
            f"GradientCompressor(prune={self.config.prune!r}, density={self.config.density}, "
            f"quantize={self.config.quantize!r}, combine={self.combine.value}, "
            f"tensors={len(self.variables)}, elements={self.num_elements})"
        )


def _agrees(name: str) -> bool:
    return SPARSIFIERS.get_class(name).agreed_indices


def compression_ratio(raw_bytes: int, payload_bytes: int) -> float:
    """Raw / payload (inf for an empty payload)."""
    return math.inf if payload_bytes == 0 else raw_bytes / payload_bytes
