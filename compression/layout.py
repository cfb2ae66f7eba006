"""Where each gradient sits in the compressor's one flat vector: pruned tensors first, then dense.

Residuals, momenta and shared scores are stored in this layout; the payloads are built from
it and decoded back into it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from globaldl.compression.base import TensorInfo
from globaldl.compression.sparsifier import kept_count
from globaldl.compression.weight_pruning import WeightPruning, is_prunable


class FlatLayout:
    """The static layout of a model's gradients (every attribute is known at trace time).

    Args:
        variables: the trainable variables, in the order gradients will be given.
        prunes: False when step 1 sends everything (then every tensor is sent dense).
        dense_below_elements: tensors with fewer elements are never pruned.
        density: the configured fraction kept per pruned tensor (for the static counts).
        weight_pruning: the weight masks, or None.

    Attributes:
        tensor_infos: a TensorInfo per variable, in variable order.
        order: the same, in layout order (pruned tensors first).
        sparse_infos, dense_infos: the pruned and the dense-sent tensors, in layout order.
        num_elements, sparse_elements, dense_elements: sizes of the whole and its two parts.
        caps: per pruned tensor, the entries weight pruning leaves at most (None if off).
        static_kept: per pruned tensor, the entries kept at the configured density.
        dense_count_varies: dense-sent kernels lose entries as their weights are pruned.

    """

    def __init__(
        self,
        variables: list[tf.Variable],
        prunes: bool,
        dense_below_elements: int,
        density: float,
        weight_pruning: WeightPruning | None,
    ) -> None:
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        is_sparse = [prunes and size > 0 and size >= dense_below_elements for size in sizes]
        order = [i for i in range(len(shapes)) if is_sparse[i]] + [
            i for i in range(len(shapes)) if not is_sparse[i]
        ]
        infos: dict[int, TensorInfo] = {}
        offset = 0
        for index in order:
            infos[index] = TensorInfo(
                name=variables[index].name,
                shape=shapes[index],
                index=index,
                offset=offset,
                sparse=is_sparse[index],
                prunable_weights=weight_pruning is not None and is_prunable(shapes[index]),
            )
            offset += sizes[index]
        self.weight_pruning = weight_pruning
        self.tensor_infos: list[TensorInfo] = [infos[i] for i in range(len(shapes))]
        self.order = [infos[i] for i in order]
        self.sparse_infos = [info for info in self.order if info.sparse]
        self.dense_infos = [info for info in self.order if not info.sparse]
        self.num_elements = offset
        self.sparse_elements = sum(info.size for info in self.sparse_infos)
        self.dense_elements = self.num_elements - self.sparse_elements
        self.caps = {
            info.index: (weight_pruning.remaining(info.index) if info.prunable_weights else None)
            for info in self.sparse_infos
        }
        self.static_kept = [
            kept_count(info.size, density, self.caps[info.index]) for info in self.sparse_infos
        ]
        self.dense_count_varies = any(info.prunable_weights for info in self.dense_infos)

    def sum_value_groups(self) -> np.ndarray:
        """Scale group (tensor, in layout order) of each value of a summed payload.

        A summed payload holds the kept entries of each pruned tensor (``static_kept`` of
        each), then every dense-sent entry.
        """
        counts = [*self.static_kept, *(info.size for info in self.dense_infos)]
        return np.repeat(np.arange(len(counts), dtype=np.int32), counts)

    def flatten(self, gradients: list[tf.Tensor | None]) -> tuple[tf.Tensor, tf.Tensor]:
        """Float32 [N] in layout order (zeros if any entry is NaN/Inf), and that flag."""
        pieces = []
        for info in self.order:
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

    def unflatten(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """Split a flat [N] vector in this layout into the variables' shapes."""
        pieces = tf.split(flat, [info.size for info in self.order]) if self.order else []
        by_index = {info.index: piece for info, piece in zip(self.order, pieces, strict=True)}
        return [tf.reshape(by_index[info.index], info.shape) for info in self.tensor_infos]

    def keep_mask(self) -> tf.Tensor | None:
        """Bool [N]: False at weights pruned to zero; None when weight pruning is off."""
        if self.weight_pruning is None:
            return None
        pieces = []
        for info in self.order:
            mask = self.weight_pruning.masks.get(info.index)
            pieces.append(tf.ones([info.size], tf.bool) if mask is None else tf.reshape(mask, [-1]))
        return tf.concat(pieces, axis=0)

    def dense_positions(self, keep: tf.Tensor | None) -> tf.Tensor | None:
        """Flat positions of the entries sent dense; None when that is all of them, in order."""
        if keep is None or not self.dense_count_varies:
            return None
        dense_keep = keep[self.sparse_elements :]
        return tf.cast(tf.where(dense_keep)[:, 0], tf.int32) + self.sparse_elements

    def place_dense(self, dense_positions: tf.Tensor | None, values: tf.Tensor) -> tf.Tensor:
        """Dense-sent values [D] -> the dense part of the flat layout."""
        if dense_positions is None:
            return values
        return tf.scatter_nd(
            (dense_positions - self.sparse_elements)[:, tf.newaxis], values, [self.dense_elements]
        )

    def place_sparse(self, positions: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """Kept values at their flat positions -> the pruned part of the flat layout."""
        return tf.scatter_nd(positions[:, tf.newaxis], values, [self.sparse_elements])
