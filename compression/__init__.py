"""globaldl.compression: two-step gradient compression (prune, then quantize) in pure TensorFlow.

``GradientCompressor`` turns all of a model's gradients into one payload per step and back;
the codecs below it are registered by name:

* sparsifiers (step 1): ``none``, ``topk``, ``randomk``, ``threshold``, ``dgc``, and the
  ones whose positions every rank agrees on, so the payloads sum: ``shared-randomk``,
  ``shared-topk``; and ``powersgd`` (rank-r factors, summed in two rounds);
* quantizers (step 2): ``none``, ``fp16``, ``int8``, ``qsgd``, ``terngrad``, ``sign``, and
  ``intsum`` (integer codes on a shared scale, summed exactly; summed payloads only).

No Horovod and no file I/O here: the exchange (``globaldl.exchange``) moves the payloads,
reading only the compressor's :class:`WireSpec`.

The settings (:class:`CompressionConfig`) and the wire declaration import no TensorFlow; every
other name loads on first use (PEP 562), so validating settings and ``--help`` stay light.
"""

from __future__ import annotations

from typing import Any

from globaldl.compression.config import PRUNE_NAMES, QUANTIZE_NAMES, CompressionConfig
from globaldl.compression.wire_spec import Combine, WireSpec

_EAGER = {"PRUNE_NAMES", "QUANTIZE_NAMES", "CompressionConfig", "Combine", "WireSpec"}


def __getattr__(name: str) -> Any:
    if name in __all__ and name not in _EAGER:
        from globaldl.compression import codecs

        return getattr(codecs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DGC",
    "FP16",
    "PRUNE_NAMES",
    "QSGD",
    "QUANTIZERS",
    "QUANTIZE_NAMES",
    "SPARSIFIERS",
    "Codec",
    "Combine",
    "CompressionConfig",
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
    "WireSpec",
    "compression_ratio",
    "get",
    "get_quantizer",
    "get_sparsifier",
    "serialize",
]
