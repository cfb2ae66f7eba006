"""Every codec, registered, and the lookup functions (this module loads TensorFlow).

`globaldl.compression` re-exports these names lazily, so importing its settings stays light.
"""

from __future__ import annotations

from typing import Any

from globaldl.compression import (
    dgc,
    fp16,
    int8,
    intsum,
    powersgd,
    qsgd,
    randomk,
    shared_randomk,
    shared_topk,
    sign,
    terngrad,
    threshold,
    topk,
)
from globaldl.compression.base import Codec, Registry, TensorInfo, serialize
from globaldl.compression.compressor import GradientCompressor, compression_ratio
from globaldl.compression.config import PRUNE_NAMES, QUANTIZE_NAMES
from globaldl.compression.dgc import DGC
from globaldl.compression.fp16 import FP16
from globaldl.compression.int8 import Int8
from globaldl.compression.intsum import IntSum
from globaldl.compression.powersgd import PowerSGD
from globaldl.compression.qsgd import QSGD
from globaldl.compression.quantizer import QUANTIZERS, NoQuantization, QuantizedValues, Quantizer
from globaldl.compression.randomk import RandomK
from globaldl.compression.shared_randomk import SharedRandomK
from globaldl.compression.shared_topk import SharedTopK
from globaldl.compression.sign import Sign
from globaldl.compression.sparsifier import SPARSIFIERS, NoPruning, Sparsifier
from globaldl.compression.state import StateUpdate
from globaldl.compression.terngrad import TernGrad
from globaldl.compression.threshold import Threshold
from globaldl.compression.topk import TopK

# imported to register
del dgc, fp16, int8, intsum, powersgd, qsgd, randomk, shared_randomk, shared_topk, sign, terngrad
del threshold, topk


def get_sparsifier(identifier: str | dict[str, Any] | Sparsifier) -> Sparsifier:
    """A sparsifier from a name (``PRUNE_NAMES``), a config dict or an instance."""
    return SPARSIFIERS.get(identifier)


def get_quantizer(identifier: str | dict[str, Any] | Quantizer) -> Quantizer:
    """A quantizer from a name (``QUANTIZE_NAMES``), a config dict or an instance."""
    return QUANTIZERS.get(identifier)


def get(identifier: str | dict[str, Any] | Codec) -> Codec:
    """Any codec from a name, a config dict (``{"class_name": ..., "config": {...}}``) or itself.

    "none" names both a sparsifier and a quantizer: use :func:`get_sparsifier` or
    :func:`get_quantizer` for it (or the class names ``NoPruning`` / ``NoQuantization``).
    """
    if isinstance(identifier, Codec):
        return identifier
    name = identifier.get("class_name") if isinstance(identifier, dict) else identifier
    registries = [r for r in (SPARSIFIERS, QUANTIZERS) if isinstance(name, str) and name in r]
    if len(registries) > 1:
        raise ValueError(
            f"{name!r} names both a sparsifier and a quantizer; use get_sparsifier({name!r}) "
            f"or get_quantizer({name!r})"
        )
    if not registries:
        raise ValueError(
            f"unknown codec {identifier!r}; valid sparsifiers: {list(PRUNE_NAMES)}, "
            f"valid quantizers: {list(QUANTIZE_NAMES)}"
        )
    return registries[0].get(identifier)


__all__ = [
    "DGC",
    "FP16",
    "QSGD",
    "QUANTIZERS",
    "SPARSIFIERS",
    "Codec",
    "GradientCompressor",
    "Int8",
    "IntSum",
    "NoPruning",
    "NoQuantization",
    "PowerSGD",
    "QuantizedValues",
    "Quantizer",
    "RandomK",
    "Registry",
    "SharedRandomK",
    "SharedTopK",
    "Sign",
    "Sparsifier",
    "StateUpdate",
    "TensorInfo",
    "TernGrad",
    "Threshold",
    "TopK",
    "compression_ratio",
    "get",
    "get_quantizer",
    "get_sparsifier",
    "serialize",
]
