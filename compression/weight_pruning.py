"""Magnitude pruning of the weights on tensorflow-model-optimization's PolynomialDecay schedule."""

from __future__ import annotations

import math
import re

import tensorflow as tf

POLYNOMIAL_POWER = 3  # tfmot's default: prune fast at first, then level off


def is_prunable(shape: tuple[int, ...]) -> bool:
    """Kernels (2 or more dimensions) are pruned; biases and normalisation parameters are not.

    The same rule as ``tfmot.sparsity.keras.prune_low_magnitude`` applies to Dense and Conv
    layers: only their kernels are pruned.
    """
    return len(shape) >= 2 and all(dim > 0 for dim in shape)


class WeightPruning:
    """Keeps a boolean mask per kernel; pruned weights stay zero and are never sent.

    The sparsity at each step comes from ``tfmot.sparsity.keras.PolynomialDecay`` (initial
    sparsity 0, final ``final_sparsity``, power 3). At every step where that schedule says
    "prune", :meth:`update_masks` keeps the ``size - round(size * sparsity)`` largest
    magnitudes of each kernel. Every rank holds the same weights, so every rank computes the
    same masks without communicating.
    """

    def __init__(
        self,
        variables: list[tf.Variable],
        final_sparsity: float,
        begin_step: int,
        end_step: int,
        frequency_steps: int,
    ) -> None:
        # Imported here: tfmot pulls in tf-keras, which only weight pruning needs.
        from tensorflow_model_optimization.sparsity.keras import PolynomialDecay

        self.schedule = PolynomialDecay(
            initial_sparsity=0.0,
            final_sparsity=float(final_sparsity),
            begin_step=begin_step,
            end_step=end_step,
            power=POLYNOMIAL_POWER,
            frequency=frequency_steps,
        )
        self.final_sparsity = float(final_sparsity)
        self.variables = list(variables)
        self.masks: dict[int, tf.Variable] = {}
        for index, variable in enumerate(self.variables):
            if is_prunable(tuple(variable.shape)):
                self.masks[index] = tf.Variable(
                    tf.ones(variable.shape, tf.bool),
                    trainable=False,
                    name=f"weight_mask_{index:03d}_{_clean(variable.name)}",
                )

    @property
    def mask_variables(self) -> list[tf.Variable]:
        """The masks, in variable order."""
        return [self.masks[index] for index in sorted(self.masks)]

    def remaining(self, index: int) -> int:
        """Entries of variable ``index`` still unpruned at the final sparsity (static)."""
        size = int(self.variables[index].shape.num_elements())
        if index not in self.masks:
            return size
        # ceil, not round: never above what update_masks leaves, whatever float32 does to s.
        return max(1, size - math.ceil(size * self.final_sparsity))

    def sparsity_at(self, step: tf.Tensor) -> tf.Tensor:
        """The scheduled weight sparsity (float32) at ``step``."""
        return self.schedule(tf.cast(step, tf.int64))[1]

    def mask_gradients(self, gradients: list[tf.Tensor | None]) -> list[tf.Tensor | None]:
        """Gradients with pruned entries set to zero."""
        return [
            gradient
            if gradient is None or index not in self.masks
            else gradient * tf.cast(self.masks[index], gradient.dtype)
            for index, gradient in enumerate(gradients)
        ]

    def apply_masks(self) -> None:
        """Set pruned weights to zero (after the optimizer, so momentum cannot revive them)."""
        for index, mask in self.masks.items():
            variable = self.variables[index]
            variable.assign(variable * tf.cast(mask, variable.dtype))

    def update_masks(self, step: tf.Tensor) -> tf.Tensor:
        """Recompute the masks if the schedule prunes at ``step``; returns whether it did."""
        should_prune, sparsity = self.schedule(tf.cast(step, tf.int64))

        def prune() -> tf.Tensor:
            for index, mask in self.masks.items():
                variable = self.variables[index]
                magnitudes = tf.reshape(tf.abs(tf.cast(variable, tf.float32)), [-1])
                size = int(magnitudes.shape[0])
                pruned = tf.cast(tf.floor(tf.cast(sparsity, tf.float64) * size + 0.5), tf.int32)
                keep = tf.clip_by_value(size - pruned, 1, size)
                kept = tf.math.top_k(magnitudes, keep, sorted=False).indices
                new_mask = tf.scatter_nd(kept[:, tf.newaxis], tf.ones_like(kept, tf.bool), [size])
                mask.assign(tf.reshape(new_mask, variable.shape))
            self.apply_masks()
            return tf.constant(True)

        return tf.cond(should_prune, prune, lambda: tf.constant(False))


def _clean(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", name.split(":")[0]).strip("_")
