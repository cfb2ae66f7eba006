"""GradientCompressor: all of a model's gradients into one payload per step, and back."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from globaldl.compression import elias_fano
from globaldl.compression.base import TensorInfo, check_range, check_type
from globaldl.compression.blocks import block_layout, static_block_count
from globaldl.compression.config import CompressionConfig
from globaldl.compression.quantizer import QUANTIZERS, QuantizedValues, Quantizer
from globaldl.compression.sparsifier import EXCLUDED, SPARSIFIERS, Sparsifier, kept_count
from globaldl.compression.weight_pruning import WeightPruning, is_prunable
from globaldl.compression.wire import GatherWireFormat
from globaldl.compression.wire_spec import Combine, WireSpec

_SELECT_SALT = 1
_DENSE_SALT = 2
_SPARSE_SALT = 3


# Every branch and loop here is on static Python values (tf.cond where a tensor decides), so
# AutoGraph has nothing to convert; skipping it makes tracing the trainer's step much faster.
_plain_python = tf.autograph.experimental.do_not_convert


def _fold(seed: tf.Tensor, salt: int) -> tf.Tensor:
    """A new stateless seed derived from ``seed`` and ``salt``."""
    return tf.random.experimental.stateless_fold_in(seed, salt)


class StateUpdate(NamedTuple):
    """New values for ``GradientCompressor.step_state_variables``, in that order.

    A NamedTuple of tensors, so it can be returned from (or passed into) a ``tf.function``.
    """

    values: tuple[tf.Tensor, ...]


class GradientCompressor:
    """Compresses ALL gradients of a model into ONE payload per step (one collective per step).

    Per step, on every rank::

        payload, update = compressor.compress(gradients, step)        # phase: compress
        exchanged = <allreduce or allgather of payload>                # phase: exchange
        averaged, any_nonfinite = compressor.decompress(exchanged, lengths, num_ranks)
        if not any_nonfinite:                                          # phase: apply
            optimizer.apply_gradients(zip(averaged, variables))
            compressor.apply_state(update)
            compressor.apply_weight_masks()
            compressor.update_weight_masks(step)

    Layout: gradients are cast to float32 and laid out in one flat vector, the pruned
    ("sparse") tensors first, then the tensors sent dense (fewer than
    ``config.dense_below_elements`` entries, or every tensor when ``prune == "none"``).

    ``combine`` is SUM (allreduce) when nothing is pruned and the quantizer is none or fp16:
    the payload is then the flat vector (float32, or float16) plus one trailing flag element.
    Otherwise it is GATHER (allgather) of one uint8 buffer per rank; see
    :mod:`globaldl.compression.wire` for its layout.

    With ``prune == "dgc"`` the momentum is applied here (``applies_momentum`` is True): the
    optimizer must then be plain SGD without momentum.

    Args:
        config: the settings.
        variables: the trainable variables, in the order gradients will be given.
        steps_per_epoch: for DGC's warm-up and the weight-pruning schedule.
        rank: this rank (only varies the stochastic draws between ranks).
        num_ranks: ranks at construction (only scales DGC's clip_norm).

    Attributes:
        combine: how the exchange combines payloads (Combine.SUM or Combine.GATHER).
        payload_dtype: float32 / float16 (SUM) or uint8 (GATHER).
        raw_bytes_per_step: bytes of all gradients as dense float32.
        fixed_payload_bytes: the exact payload length when it never varies (always for SUM;
            for GATHER with topk/randomk/none and no weight pruning of dense-sent kernels),
            else None (threshold, dgc, or dense-sent kernels being weight-pruned).
        state_variables: everything to checkpoint (residual, momentum, weight masks).
        step_state_variables: the part of it a StateUpdate carries (residual, momentum).
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
        self._build_layout()

        self.lossless = self.sparsifier.sends_everything and self.quantizer.is_lossless
        # The codecs' declarations decide, never their names: payloads sum when every rank
        # sends the same positions and the quantizer's symbols add up to the values' sum.
        summable = self.sparsifier.sends_everything and self.quantizer.sum_dtype is not None
        self.combine = Combine.SUM if summable else Combine.GATHER
        self.payload_dtype = tf.as_dtype(self.quantizer.sum_dtype if summable else "uint8")
        self.applies_momentum = self.sparsifier.applies_momentum
        self.raw_bytes_per_step = 4 * self.num_elements

        self._residual: tf.Variable | None = None
        self._momentum: tf.Variable | None = None
        if config.error_feedback and not self.lossless:
            self._residual = tf.Variable(
                tf.zeros([self.num_elements]), trainable=False, name="compression_residual"
            )
        if self.applies_momentum:
            self._momentum = tf.Variable(
                tf.zeros([self.num_elements]), trainable=False, name="compression_momentum"
            )
        self.step_state_variables: list[tf.Variable] = [
            v for v in (self._residual, self._momentum) if v is not None
        ]
        self.state_variables: list[tf.Variable] = self.step_state_variables + (
            self.weight_pruning.mask_variables if self.weight_pruning else []
        )
        self.fixed_payload_bytes = self._fixed_payload_bytes()
        self.wire_spec = WireSpec(
            combine=self.combine,
            dtype=self.payload_dtype.name,
            round_bytes=(self.fixed_payload_bytes,),
        )

    # ----------------------------------------------------------------------------------- layout
    def _build_layout(self) -> None:
        config = self.config
        shapes = [tuple(int(d) for d in v.shape) for v in self.variables]
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        is_sparse = [
            not self.sparsifier.sends_everything
            and size > 0
            and size >= config.dense_below_elements
            for size in sizes
        ]
        order = [i for i in range(len(shapes)) if is_sparse[i]] + [
            i for i in range(len(shapes)) if not is_sparse[i]
        ]
        infos: dict[int, TensorInfo] = {}
        offset = 0
        for index in order:
            infos[index] = TensorInfo(
                name=self.variables[index].name,
                shape=shapes[index],
                index=index,
                offset=offset,
                sparse=is_sparse[index],
                prunable_weights=self.weight_pruning is not None and is_prunable(shapes[index]),
            )
            offset += sizes[index]
        self.tensor_infos: list[TensorInfo] = [infos[i] for i in range(len(shapes))]
        self._layout_order = [infos[i] for i in order]
        self.sparse_infos = [info for info in self._layout_order if info.sparse]
        self.dense_infos = [info for info in self._layout_order if not info.sparse]
        self.num_elements = offset
        self.sparse_elements = sum(info.size for info in self.sparse_infos)
        self.dense_elements = self.num_elements - self.sparse_elements
        self._caps = {
            info.index: (
                self.weight_pruning.remaining(info.index) if info.prunable_weights else None
            )
            for info in self.sparse_infos
        }
        self._static_kept = [
            kept_count(info.size, config.density, self._caps[info.index])
            for info in self.sparse_infos
        ]
        # Dense-sent kernels lose entries as weights are pruned: then the dense part varies.
        self._dense_count_varies = any(info.prunable_weights for info in self.dense_infos)
        self.wire = GatherWireFormat(
            sparse_universe=self.sparse_elements,
            low_bits=elias_fano.low_bits_for(self.sparse_elements, sum(self._static_kept)),
            bits_per_value=self.quantizer.bits_per_value,
            uses_scales=self.quantizer.uses_scales,
            block_size=self.quantizer.block_size,
            sparse_tensor_starts=tuple(info.offset for info in self.sparse_infos),
        )

    def _fixed_payload_bytes(self) -> int | None:
        if self._dense_count_varies:
            return None
        if self.combine is Combine.SUM:
            return (self.dense_elements + 1) * self.payload_dtype.size
        if not self.sparsifier.fixed_count:
            return None
        sparse_blocks = static_block_count(self._static_kept, self.wire.block_size)
        return self.wire.size_bytes(self.dense_elements, sum(self._static_kept), sparse_blocks)

    # --------------------------------------------------------------------------------- compress
    @_plain_python
    def compress(
        self, gradients: list[tf.Tensor | None], step: tf.Tensor
    ) -> tuple[tf.Tensor, StateUpdate]:
        """Return this rank's payload for ``gradients`` at global ``step``, and the state it leaves.

        SUM: float32 (float16 for fp16) vector = the gradients (after error feedback and
        quantization) + one trailing element, 1.0 if the gradients had NaN/Inf (then the rest
        is zeros) else 0.0. GATHER: one uint8 buffer (see :mod:`globaldl.compression.wire`).
        Changes no variable: the new residual/momentum come back in the StateUpdate (the old
        values when the gradients were not finite).
        """
        if len(gradients) != len(self.variables):
            raise ValueError(f"got {len(gradients)} gradients for {len(self.variables)} variables")
        step = tf.cast(step, tf.int64)
        gradient, nonfinite = self._flatten(gradients)
        keep = self._flat_keep_mask()
        residual = None if self._residual is None else tf.convert_to_tensor(self._residual)
        momentum = None if self._momentum is None else tf.convert_to_tensor(self._momentum)
        accumulated, new_momentum = self.sparsifier.accumulate(gradient, residual, momentum)
        if keep is not None:
            accumulated = tf.where(keep, accumulated, 0.0)
            if new_momentum is not None:
                new_momentum = tf.where(keep, new_momentum, 0.0)
        # A rank whose gradients are not finite sends zeros (and its flag).
        accumulated = tf.where(nonfinite, tf.zeros_like(accumulated), accumulated)
        seed = self._seed(step)

        dense_positions = self._dense_positions(keep)
        dense_values = (
            accumulated[self.sparse_elements :]
            if dense_positions is None
            else tf.gather(accumulated, dense_positions)
        )
        dense = self.quantizer.quantize(dense_values, _fold(seed, _DENSE_SALT))
        sparse_positions = self._select(accumulated, keep, step, _fold(seed, _SELECT_SALT))
        sparse = None
        if self.sparse_infos:
            blocks = None
            if self.wire.uses_scales:
                blocks = block_layout(
                    sparse_positions,
                    tf.zeros_like(sparse_positions),
                    1,
                    np.asarray(self.wire.sparse_tensor_starts, np.int32),
                    self.wire.block_size,
                )
            sparse = self.quantizer.quantize(
                tf.gather(accumulated, sparse_positions), _fold(seed, _SPARSE_SALT), blocks
            )

        if self.combine is Combine.SUM:
            flag = tf.cast(tf.reshape(nonfinite, [1]), tf.float32)
            payload = tf.cast(tf.concat([dense.reconstruction, flag], axis=0), self.payload_dtype)
        else:
            payload = self.wire.encode(nonfinite, dense, sparse_positions, sparse)

        new_state = []
        if self._residual is not None:
            sent = self._scatter_sent(sparse_positions, sparse, dense_positions, dense)
            new_state.append(accumulated - sent)
        if self._momentum is not None:
            sent_mask = tf.scatter_nd(
                sparse_positions[:, tf.newaxis],
                tf.ones_like(sparse_positions, tf.bool),
                [self.num_elements],
            )
            new_state.append(self.sparsifier.after_send(new_momentum, sent_mask))
        new_state = [
            tf.where(nonfinite, tf.convert_to_tensor(variable), value)
            for variable, value in zip(self.step_state_variables, new_state, strict=True)
        ]
        return payload, StateUpdate(tuple(new_state))

    def _scatter_sent(
        self,
        sparse_positions: tf.Tensor,
        sparse: QuantizedValues | None,
        dense_positions: tf.Tensor | None,
        dense: QuantizedValues,
    ) -> tf.Tensor:
        """What the receivers will decode from this rank, as a flat float32 [N] vector."""
        pieces = []
        if sparse is not None:
            pieces.append(
                tf.scatter_nd(
                    sparse_positions[:, tf.newaxis], sparse.reconstruction, [self.sparse_elements]
                )
            )
        pieces.append(self._place_dense(dense_positions, dense.reconstruction))
        return tf.concat(pieces, axis=0)

    def _place_dense(self, dense_positions: tf.Tensor | None, values: tf.Tensor) -> tf.Tensor:
        """Dense-sent values [D] (or [.., D]) -> the dense part of the flat layout."""
        if dense_positions is None:
            return values
        return tf.scatter_nd(
            (dense_positions - self.sparse_elements)[:, tf.newaxis], values, [self.dense_elements]
        )

    def _flatten(self, gradients: list[tf.Tensor | None]) -> tuple[tf.Tensor, tf.Tensor]:
        pieces = []
        for info in self._layout_order:
            gradient = gradients[info.index]
            if gradient is None:
                pieces.append(tf.zeros([info.size], tf.float32))
                continue
            gradient = tf.convert_to_tensor(gradient)
            if gradient.shape.is_fully_defined() and gradient.shape.num_elements() != info.size:
                raise ValueError(
                    f"gradient {info.index} has shape {gradient.shape.as_list()} but variable "
                    f"{info.name!r} has shape {list(info.shape)}"
                )
            if gradient.dtype != tf.float32:
                gradient = tf.cast(gradient, tf.float32)
            pieces.append(tf.reshape(gradient, [-1]))
        flat = tf.concat(pieces, axis=0) if pieces else tf.zeros([0], tf.float32)
        nonfinite = tf.logical_not(tf.reduce_all(tf.math.is_finite(flat)))
        return tf.where(nonfinite, tf.zeros_like(flat), flat), nonfinite

    def _flat_keep_mask(self) -> tf.Tensor | None:
        """Bool [N]: False at weights pruned to zero; None when weight pruning is off."""
        if self.weight_pruning is None:
            return None
        pieces = []
        for info in self._layout_order:
            mask = self.weight_pruning.masks.get(info.index)
            pieces.append(tf.ones([info.size], tf.bool) if mask is None else tf.reshape(mask, [-1]))
        return tf.concat(pieces, axis=0)

    def _dense_positions(self, keep: tf.Tensor | None) -> tf.Tensor | None:
        """Flat positions of the entries sent dense; None when that is all of them, in order."""
        if keep is None or not self._dense_count_varies:
            return None
        dense_keep = keep[self.sparse_elements :]
        return tf.cast(tf.where(dense_keep)[:, 0], tf.int32) + self.sparse_elements

    def _dense_count(self, dense_positions: tf.Tensor | None) -> int | tf.Tensor:
        return self.dense_elements if dense_positions is None else tf.size(dense_positions)

    def _select(
        self, accumulated: tf.Tensor, keep: tf.Tensor | None, step: tf.Tensor, seed: tf.Tensor
    ) -> tf.Tensor:
        if not self.sparse_infos:
            return tf.zeros([0], tf.int32)
        magnitudes = tf.abs(accumulated[: self.sparse_elements])
        if keep is not None:
            magnitudes = tf.where(keep[: self.sparse_elements], magnitudes, EXCLUDED)
        density: float | tf.Tensor = self.config.density
        if self.sparsifier.uses_warmup:
            density = self.sparsifier.density_at(self.config.density, step // self.steps_per_epoch)
        pieces = []
        for info in self.sparse_infos:
            num_kept = kept_count(info.size, density, self._caps[info.index])
            indices = self.sparsifier.select(
                magnitudes[info.offset : info.offset + info.size],
                num_kept,
                _fold(seed, info.index),
            )
            pieces.append(tf.cast(indices, tf.int32) + info.offset)
        return tf.concat(pieces, axis=0)

    def _seed(self, step: tf.Tensor) -> tf.Tensor:
        base = tf.constant([self.config.seed, self.rank], tf.int64)
        return tf.random.experimental.stateless_fold_in(base, step)

    # ------------------------------------------------------------------------------- decompress
    @_plain_python
    def decompress(
        self, exchanged: tf.Tensor, lengths: tf.Tensor | None, num_ranks: tf.Tensor
    ) -> tuple[list[tf.Tensor], tf.Tensor]:
        """The AVERAGED float32 gradients (variables' shapes) and whether any rank was nonfinite.

        SUM: ``exchanged`` is the elementwise sum of every rank's payload (``lengths`` unused).
        GATHER: the concatenation of every rank's buffer in rank order, ``lengths`` the byte
        length of each (may be None when ``fixed_payload_bytes`` is set). Ranks that flagged
        NaN/Inf contribute zeros, so the result stays finite; the trainer should skip the step.
        """
        num_ranks = tf.cast(num_ranks, tf.int32)
        dense_positions = self._dense_positions(self._flat_keep_mask())
        if self.combine is Combine.SUM:
            exchanged = tf.cast(tf.reshape(exchanged, [-1]), tf.float32)
            any_nonfinite = exchanged[-1] > 0.5
            summed = self._place_dense(dense_positions, exchanged[:-1])
        else:
            if lengths is None:
                if self.fixed_payload_bytes is None:
                    raise ValueError("lengths=None needs a fixed payload size; this payload varies")
                lengths = tf.fill([num_ranks], tf.constant(self.fixed_payload_bytes, tf.int64))
            decoded = self.wire.decode(
                exchanged, lengths, self._dense_count(dense_positions), self.fixed_payload_bytes
            )
            any_nonfinite = tf.reduce_any(decoded.nonfinite)
            # Ranks that flagged NaN/Inf contribute nothing.
            dense_values = self.quantizer.dequantize(decoded.dense_symbols, decoded.dense_scales)
            dense_values = tf.where(decoded.nonfinite[:, tf.newaxis], 0.0, dense_values)
            pieces = []
            if self.sparse_infos:
                sparse_values = self.quantizer.dequantize(
                    decoded.sparse_symbols, decoded.sparse_scales, decoded.sparse_blocks
                )
                sparse_values = tf.where(
                    tf.gather(decoded.nonfinite, decoded.sparse_rank_ids), 0.0, sparse_values
                )
                pieces.append(
                    tf.math.unsorted_segment_sum(
                        sparse_values, decoded.sparse_positions, self.sparse_elements
                    )
                )
            pieces.append(self._place_dense(dense_positions, tf.reduce_sum(dense_values, axis=0)))
            summed = tf.concat(pieces, axis=0)
        averaged = summed / tf.cast(num_ranks, tf.float32)
        return self.unflatten(averaged), any_nonfinite

    @_plain_python
    def unflatten(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """Split a flat [N] vector in this compressor's layout into the variables' shapes.

        The layout puts pruned tensors first; residuals and momenta are stored in it.
        """
        pieces = (
            tf.split(flat, [info.size for info in self._layout_order]) if self._layout_order else []
        )
        by_index = {
            info.index: piece for info, piece in zip(self._layout_order, pieces, strict=True)
        }
        return [tf.reshape(by_index[info.index], info.shape) for info in self.tensor_infos]

    # ------------------------------------------------------------------------------------ state
    @_plain_python
    def apply_state(self, update: StateUpdate) -> None:
        """Assign the state a (successful) step leaves: residuals and momenta."""
        if len(update.values) != len(self.step_state_variables):
            raise ValueError(
                f"StateUpdate has {len(update.values)} values for "
                f"{len(self.step_state_variables)} state variables"
            )
        for variable, value in zip(self.step_state_variables, update.values, strict=True):
            variable.assign(value)

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


def compression_ratio(raw_bytes: int, payload_bytes: int) -> float:
    """Raw / payload (inf for an empty payload)."""
    return math.inf if payload_bytes == 0 else raw_bytes / payload_bytes
