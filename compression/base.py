"""The pieces every codec shares: the tensor description, the configurable base and the registry."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One gradient tensor as the compressor sees it (static, known at trace time).

    Attributes:
        name: the variable's name (for messages and state-variable names).
        shape: the variable's shape.
        index: position of the variable in the list given to the compressor.
        offset: position of the tensor's first element in the compressor's flat layout.
        sparse: True when step 1 (pruning) applies to it; False for tensors sent dense.
        prunable_weights: True when weight pruning (``weight_sparsity``) applies to it.

    """

    name: str
    shape: tuple[int, ...]
    index: int = 0
    offset: int = 0
    sparse: bool = True
    prunable_weights: bool = False

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))


class Codec:
    """A configurable, stateless compression stage.

    Subclasses set ``name`` (the registry name, e.g. ``"topk"``), take their settings as keyword
    arguments of ``__init__`` (validated there, with messages naming the argument), and return
    the same keywords from ``get_config``, so that ``type(c).from_config(c.get_config())``
    rebuilds an equal codec. Codecs hold no TensorFlow state: whatever must survive a step
    (residuals, momenta) lives in the :class:`~globaldl.compression.GradientCompressor`.
    """

    name: ClassVar[str] = ""

    def get_config(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this codec."""
        return {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Codec:
        """Rebuild a codec from :meth:`get_config`'s output."""
        return cls(**config)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()  # type: ignore[union-attr]

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.get_config().items()))))

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


CodecT = TypeVar("CodecT", bound=Codec)


class Registry(Generic[CodecT]):
    """Maps codec names to classes; ``get`` accepts a name, a config dict or an instance.

    A config dict is ``{"class_name": <registry name or class name>, "config": {...}}`` (the
    shape Keras uses); ``"config"`` may be omitted.
    """

    def __init__(self, kind: str, base: type[CodecT]) -> None:
        self.kind = kind
        self.base = base
        self._classes: dict[str, type[CodecT]] = {}

    def register(self, cls: type[CodecT]) -> type[CodecT]:
        """Class decorator: make ``cls`` reachable under ``cls.name`` and its class name."""
        if not cls.name:
            raise ValueError(f"{cls.__name__} has no `name`; set a class attribute name = '...'")
        for key in (cls.name, cls.__name__):
            if key in self._classes and self._classes[key] is not cls:
                raise ValueError(f"{self.kind} name {key!r} is already registered")
            self._classes[key] = cls
        return cls

    @property
    def names(self) -> tuple[str, ...]:
        """The registry names (not the class names), in registration order."""
        return tuple(dict.fromkeys(cls.name for cls in self._classes.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def get(self, identifier: str | dict[str, Any] | CodecT) -> CodecT:
        """Return the codec ``identifier`` names; raise ValueError naming it otherwise."""
        if isinstance(identifier, self.base):
            return identifier
        if isinstance(identifier, str):
            return self._lookup(identifier)()
        if isinstance(identifier, dict):
            if "class_name" not in identifier:
                raise ValueError(
                    f"{self.kind} config {identifier!r} has no 'class_name'; expected "
                    f"{{'class_name': one of {list(self.names)}, 'config': {{...}}}}"
                )
            cls = self._lookup(identifier["class_name"])
            return cls.from_config(dict(identifier.get("config", {})))  # type: ignore[return-value]
        raise ValueError(
            f"cannot interpret {identifier!r} as a {self.kind}: pass one of {list(self.names)}, "
            f"a config dict or a {self.base.__name__} instance"
        )

    def get_class(self, name: str) -> type[CodecT]:
        """The class registered under ``name``; ValueError naming it and the valid names."""
        return self._lookup(name)

    def _lookup(self, name: str) -> type[CodecT]:
        try:
            return self._classes[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid names: {list(self.names)}"
            ) from None


def serialize(codec: Codec) -> dict[str, Any]:
    """The config dict ``get`` accepts: ``{"class_name": <class name>, "config": {...}}``.

    The class name (not the registry name) keeps it unambiguous: "none" names a sparsifier
    and a quantizer, ``NoPruning`` and ``NoQuantization`` do not.
    """
    return {"class_name": type(codec).__name__, "config": codec.get_config()}


def check_range(
    argument: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise ValueError naming ``argument`` and its allowed range when ``value`` is outside it."""
    too_low = low is not None and (value < low if low_inclusive else value <= low)
    too_high = high is not None and (value > high if high_inclusive else value >= high)
    if too_low or too_high or value != value:  # value != value: NaN
        left = "(-inf" if low is None else ("[" if low_inclusive else "(") + f"{low}"
        right = "inf)" if high is None else f"{high}" + ("]" if high_inclusive else ")")
        raise ValueError(f"{argument}={value!r} is out of range; allowed: {left}, {right}")


def check_type(argument: str, value: object, expected: type | tuple[type, ...]) -> None:
    """Raise ValueError naming ``argument`` when ``value`` is not of the expected type."""
    # bool is an int subclass; a flag passed where a count is expected is always a mistake.
    if isinstance(value, bool) and expected in (int, float, (int, float)):
        raise ValueError(f"{argument}={value!r} must be a number, not a bool")
    if not isinstance(value, expected):
        names = (
            expected.__name__
            if isinstance(expected, type)
            else " or ".join(t.__name__ for t in expected)
        )
        raise ValueError(f"{argument}={value!r} must be of type {names}")
