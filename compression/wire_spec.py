"""What a compressor declares about its payloads, so the exchange can move them without asking.

A :class:`WireSpec` is the whole contract between a codec and the transport (hivemind's
style: a small frozen description next to the pure codec). The exchange reads nothing else:
not the codec's name, not its settings. A compressor whose payloads can be added element by
element declares ``Combine.SUM`` and the dtype the sum is formed in; one whose payloads must be
decoded per rank declares ``Combine.GATHER``. Each round of the protocol (PowerSGD has two:
P, then Q) has the byte length of one rank's payload, or None when it varies from step to step.

No TensorFlow here: the declaration is plain data, checked by the exchange
(``globaldl.exchange.check_wire_spec``), which refuses one it cannot honour.
"""

from __future__ import annotations

import dataclasses
import enum


class Combine(enum.Enum):
    """How the exchange combines the payloads of all ranks."""

    SUM = "sum"  # elementwise sum (allreduce): per-device traffic ~2x the payload, flat in N
    GATHER = "gather"  # concatenation in rank order (allgather), decoded per rank: ~N x payload


DTYPE_BYTES = {
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "float16": 2,
    "int32": 4,
    "float32": 4,
    "int64": 8,
    "float64": 8,
}
"""Bytes per element of the dtypes a payload may declare (numpy / TensorFlow names)."""


@dataclasses.dataclass(frozen=True)
class WireSpec:
    """How one compressor's payloads cross the network each step.

    Attributes:
        combine: SUM (allreduce) or GATHER (allgather, decoded per rank).
        dtype: element type of every payload, e.g. "float32", "uint8", "int64". For SUM it is
            the type the sum is formed in, so it must hold the sum of all ranks' payloads.
        round_bytes: per round of the protocol, the bytes of one rank's payload, or None when
            that length varies from step to step. GATHER: each rank's may differ, so a 4-byte
            length is exchanged first. SUM: at any one step every rank's has the same length
            (allreduce needs it; Horovod checks it), e.g. derived from weight masks all share.

    """

    combine: Combine
    dtype: str
    round_bytes: tuple[int | None, ...]

    @property
    def rounds(self) -> int:
        """Collectives that carry payload per step (before any hierarchy multiplies them)."""
        return len(self.round_bytes)

    @property
    def fixed_length(self) -> bool:
        """Whether every round's payload has the same length at every step."""
        return all(length is not None for length in self.round_bytes)

    @property
    def element_bytes(self) -> int:
        """Bytes per payload element (0 for a dtype this module does not know)."""
        return DTYPE_BYTES.get(self.dtype, 0)

    def describe(self) -> dict[str, object]:
        """The declaration as plain JSON values (for the run summary and messages)."""
        return {
            "combine": self.combine.value if isinstance(self.combine, Combine) else self.combine,
            "dtype": self.dtype,
            "round_bytes": list(self.round_bytes),
        }
