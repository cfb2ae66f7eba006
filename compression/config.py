"""The compression settings users choose: one CompressionConfig, validated once, end to end.

The CLI builds it (``globaldl.settings.resolve_settings``) and hands it unchanged to the codec
(``GradientCompressor``); nothing in between copies or re-validates its fields. It imports no
TensorFlow, so bad values stop a run before TensorFlow loads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from globaldl.compression.base import check_range, check_type

PRUNE_NAMES = (
    "none",
    "topk",
    "randomk",
    "threshold",
    "dgc",
    "shared-randomk",
    "shared-topk",
    "powersgd",
)
QUANTIZE_NAMES = ("none", "fp16", "int8", "qsgd", "terngrad", "sign", "intsum")

DEFAULT_DENSE_BELOW_ELEMENTS = 1024
"""Tensors with fewer elements (biases, batch-norm scales and offsets, tiny kernels) skip
pruning: sending them dense costs little, and pruning them hurts accuracy most (DGC does the
same). They are still quantized."""


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    """Two-step gradient compression: prune (step 1), then quantize what is left (step 2).

    Attributes:
        prune: which entries are sent: one of PRUNE_NAMES.
        density: fraction of each pruned tensor's entries sent per step, in (0, 1]
            (at least one entry per non-empty tensor).
        quantize: how sent values are encoded: one of QUANTIZE_NAMES.
        error_feedback: add what was not sent (pruned entries, quantization error) to the next
            step's gradient.
        block_size: values sharing one scale in int8, qsgd, terngrad and sign.
        qsgd_levels: quantization levels s of qsgd.
        dense_below_elements: tensors with fewer elements are not pruned (still quantized).
        weight_sparsity: final fraction of each kernel's weights pruned to zero (0 = off).
        weight_pruning_begin_epoch, weight_pruning_end_epoch: the polynomial schedule ramps
            weight sparsity from 0 to ``weight_sparsity`` between these epochs.
        weight_pruning_frequency_steps: masks are recomputed every this many steps in the ramp.
        momentum: DGC momentum correction factor (dgc only).
        clip_norm: DGC local gradient clipping: global L2 norm threshold, applied on each rank
            as clip_norm / sqrt(num_ranks) (dgc only; None = off).
        warmup_epochs: epochs of DGC's density warm-up (dgc only).
        sample_ratio, min_sample_elements: threshold estimation from a random sample
            (threshold and dgc): ceil(sample_ratio * size) entries, at least
            min_sample_elements; smaller tensors use an exact threshold.
        seed: seed of the stochastic parts (randomk, qsgd, terngrad, sampling); shared-randomk
            and shared-topk draw from it without the rank, so every rank draws alike.
        sum_bits: intsum: bits per value on the wire (one lane of the integer sum); the
            levels per rank shrink as ranks are added, the bytes do not.
        explore_fraction: shared-topk: share of each tensor's k drawn at random (shared seed)
            rather than taken from the top of the shared score.
        powersgd_rank: powersgd: rank of the factors of each pruned tensor.

    """

    prune: str = "none"
    density: float = 0.01
    quantize: str = "none"
    error_feedback: bool = True
    block_size: int = 256
    qsgd_levels: int = 16
    dense_below_elements: int = DEFAULT_DENSE_BELOW_ELEMENTS
    weight_sparsity: float = 0.0
    weight_pruning_begin_epoch: int = 0
    weight_pruning_end_epoch: int = 10
    weight_pruning_frequency_steps: int = 100
    momentum: float = 0.9
    clip_norm: float | None = None
    warmup_epochs: int = 0
    sample_ratio: float = 0.01
    min_sample_elements: int = 16384
    seed: int = 0
    sum_bits: int = 8
    explore_fraction: float = 0.1
    powersgd_rank: int = 2

    def __post_init__(self) -> None:
        _check_choice("prune", self.prune, PRUNE_NAMES)
        _check_choice("quantize", self.quantize, QUANTIZE_NAMES)
        check_type("density", self.density, (int, float))
        check_range("density", self.density, 0.0, 1.0, low_inclusive=False)
        check_type("error_feedback", self.error_feedback, bool)
        check_type("block_size", self.block_size, int)
        check_range("block_size", self.block_size, 1, 1 << 24)
        check_type("qsgd_levels", self.qsgd_levels, int)
        check_range("qsgd_levels", self.qsgd_levels, 1, 32767)
        check_type("dense_below_elements", self.dense_below_elements, int)
        check_range("dense_below_elements", self.dense_below_elements, 0)
        check_type("weight_sparsity", self.weight_sparsity, (int, float))
        check_range("weight_sparsity", self.weight_sparsity, 0.0, 1.0, high_inclusive=False)
        check_type("weight_pruning_begin_epoch", self.weight_pruning_begin_epoch, int)
        check_range("weight_pruning_begin_epoch", self.weight_pruning_begin_epoch, 0)
        check_type("weight_pruning_end_epoch", self.weight_pruning_end_epoch, int)
        check_range(
            "weight_pruning_end_epoch",
            self.weight_pruning_end_epoch,
            self.weight_pruning_begin_epoch,
            low_inclusive=False,
        )
        check_type("weight_pruning_frequency_steps", self.weight_pruning_frequency_steps, int)
        check_range("weight_pruning_frequency_steps", self.weight_pruning_frequency_steps, 1)
        check_type("momentum", self.momentum, (int, float))
        check_range("momentum", self.momentum, 0.0, 1.0, high_inclusive=False)
        if self.clip_norm is not None:
            check_type("clip_norm", self.clip_norm, (int, float))
            check_range("clip_norm", self.clip_norm, 0.0, low_inclusive=False)
        check_type("warmup_epochs", self.warmup_epochs, int)
        check_range("warmup_epochs", self.warmup_epochs, 0)
        check_type("sample_ratio", self.sample_ratio, (int, float))
        check_range("sample_ratio", self.sample_ratio, 0.0, 1.0, low_inclusive=False)
        check_type("min_sample_elements", self.min_sample_elements, int)
        check_range("min_sample_elements", self.min_sample_elements, 1)
        check_type("seed", self.seed, int)
        check_range("seed", self.seed, 0, 2**31 - 1)
        check_type("sum_bits", self.sum_bits, int)
        check_range("sum_bits", self.sum_bits, 2, 16)
        check_type("explore_fraction", self.explore_fraction, (int, float))
        check_range("explore_fraction", self.explore_fraction, 0.0, 1.0)
        check_type("powersgd_rank", self.powersgd_rank, int)
        check_range("powersgd_rank", self.powersgd_rank, 1, 64)

    def get_config(self) -> dict[str, Any]:
        """All fields as a plain dict (JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressionConfig:
        """Build from :meth:`get_config`'s output; unknown keys raise ValueError naming them."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown compression settings {unknown}; valid: {sorted(known)}")
        return cls(**config)


def _check_choice(argument: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{argument}={value!r} is not valid; allowed: {list(allowed)}")
