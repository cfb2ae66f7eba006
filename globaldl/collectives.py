"""Bytes each rank sends in Horovod's Gloo collectives, read from the algorithms' source.

Horovod 0.28.1 on the Gloo CPU path (`horovod/common/ops/gloo_operations.cc`) hands every
collective to the Gloo it vendors (`third_party/gloo` at d96897b):

* allreduce -> `gloo::allreduce` with no algorithm set, i.e. the ring (`gloo/allreduce.cc`): the
  buffer is cut into `S` segments (at least 2N, a multiple of N, at most 1 MiB each); a
  reduce-scatter and an allgather each pass S - S/N segments to the ring neighbour. Every rank
  sends 2(N-1)/N of the buffer on average (segment rounding moves a few bytes between ranks).
* allgather -> `gloo::allgatherv` (`gloo/allgatherv.cc`), a ring: in N-1 rounds each rank
  forwards one rank's block, so with equal blocks every rank sends N-1 times its own payload.
* broadcast -> `gloo::broadcast` (`gloo/broadcast.cc`), a binomial tree from the root: each
  rank sends the whole buffer once per child (the root log2(N) times, leaves never), so the
  ranks together send it N-1 times. Horovod does not fuse broadcasts: one per tensor.

Gloo's TCP transport (`gloo/transport/tcp/pair.cc`) frames every message: the sender writes a
48-byte "send ready" notice and a 48-byte preamble before the data, the receiver a 48-byte
"recv ready" notice. Ethernet/IP/TCP headers come on top; they are counted from the
interface's packet counters, not modelled here.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# gloo::AllreduceOptions::kMaxSegmentSize
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024
# sizeof(Op::preamble) in gloo/transport/tcp/pair.h: six size_t fields.
GLOO_PREAMBLE_BYTES = 48
COLLECTIVE_OPS: tuple[str, ...] = ("allreduce", "allgather", "broadcast")


@dataclass(frozen=True)
class RankTraffic:
    """What one rank's side of one or more collectives sends: payload and message counts."""

    payload_bytes: int = 0
    messages_sent: int = 0
    messages_received: int = 0

    @property
    def framing_bytes(self) -> int:
        """Gloo's notices and preambles this rank writes: 2 per message sent, 1 per received."""
        return GLOO_PREAMBLE_BYTES * (2 * self.messages_sent + self.messages_received)

    @property
    def tx_bytes(self) -> int:
        """TCP payload this rank sends: the data and Gloo's framing."""
        return self.payload_bytes + self.framing_bytes

    def __add__(self, other: RankTraffic) -> RankTraffic:
        return RankTraffic(
            self.payload_bytes + other.payload_bytes,
            self.messages_sent + other.messages_sent,
            self.messages_received + other.messages_received,
        )

    def times(self, count: int) -> RankTraffic:
        """The same collective run `count` times."""
        return RankTraffic(
            self.payload_bytes * count, self.messages_sent * count, self.messages_received * count
        )


def _check_rank(ranks: int, rank: int) -> None:
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if not 0 <= rank < ranks:
        raise ValueError(f"rank must be in 0..{ranks - 1}, got {rank}")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def ring_allreduce(
    buffer_bytes: int,
    ranks: int,
    rank: int,
    element_bytes: int = 4,
    max_segment_bytes: int = GLOO_MAX_SEGMENT_BYTES,
) -> RankTraffic:
    """One rank's side of Gloo's ring allreduce of a `buffer_bytes` buffer (gloo/allreduce.cc).

    >>> [ring_allreduce(4_000_000, 4, r).payload_bytes for r in range(4)]
    [6000000, 6000000, 6000000, 6000000]
    """
    _check_rank(ranks, rank)
    if ranks == 1 or buffer_bytes == 0:
        return RankTraffic()
    segment_limit = element_bytes * max(1, max_segment_bytes // element_bytes)
    segments = _round_up(max(-(-buffer_bytes // segment_limit), 2 * ranks), ranks)
    per_rank = segments // ranks
    segment_bytes = _round_up(-(-buffer_bytes // segments), element_bytes)
    span = segments * segment_bytes

    def length(first_segment: int, index: int) -> int:
        offset = ((first_segment * per_rank + index) * segment_bytes) % span
        return max(0, min(segment_bytes, buffer_bytes - offset))

    payload = sent = received = 0
    for index in range(segments - per_rank):
        # (segment sent, segment received) in the reduce-scatter, then in the allgather.
        for send_first, receive_first in ((rank + 1, rank + 2), (rank, rank + 1)):
            send_length = length(send_first, index)
            payload += send_length
            sent += send_length > 0
            received += length(receive_first, index) > 0
    return RankTraffic(payload, sent, received)


def ring_allgather(bytes_per_rank: int, ranks: int, rank: int) -> RankTraffic:
    """One rank's side of Gloo's ring allgatherv when every rank contributes `bytes_per_rank`.

    >>> ring_allgather(1000, 4, 0)
    RankTraffic(payload_bytes=3000, messages_sent=3, messages_received=3)
    """
    _check_rank(ranks, rank)
    if ranks == 1 or bytes_per_rank == 0:
        return RankTraffic()
    return RankTraffic(bytes_per_rank * (ranks - 1), ranks - 1, ranks - 1)


def tree_broadcast(buffer_bytes: int, ranks: int, rank: int, root: int = 0) -> RankTraffic:
    """One rank's side of Gloo's binomial-tree broadcast from `root` (gloo/broadcast.cc).

    >>> [tree_broadcast(100, 4, r).payload_bytes for r in range(4)]
    [200, 100, 0, 0]
    """
    _check_rank(ranks, rank)
    _check_rank(ranks, root)
    if ranks == 1:
        return RankTraffic()
    virtual_rank = (rank - root) % ranks
    dimensions = (ranks - 1).bit_length()  # log2, rounded up
    mask = (1 << dimensions) - 1
    sent = received = 0
    for bit in range(dimensions):
        mask ^= 1 << bit
        if virtual_rank & mask:
            continue
        if virtual_rank ^ (1 << bit) >= ranks:
            continue
        if virtual_rank & (1 << bit):
            received += 1
        else:
            sent += 1
    return RankTraffic(buffer_bytes * sent, sent, received)


def rank_traffic(
    op: str, buffer_bytes: int, ranks: int, rank: int, element_bytes: int = 1, root: int = 0
) -> RankTraffic:
    """One rank's side of one collective `op` (allreduce, allgather, broadcast)."""
    if op == "allreduce":
        return ring_allreduce(buffer_bytes, ranks, rank, element_bytes)
    if op == "allgather":
        return ring_allgather(buffer_bytes, ranks, rank)
    if op == "broadcast":
        return tree_broadcast(buffer_bytes, ranks, rank, root)
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVE_OPS)}")


def tx_bytes_per_wire_byte(combine: str, ranks: int) -> float:
    """Bytes one rank sends, on average, per byte it hands to the step's collective.

    `sum` payloads go through the ring allreduce: 2(N-1)/N. `gather` payloads go through the
    ring allgather: every rank's payload reaches the N-1 others, N-1. Both are 1 at N = 2 and
    0 on one rank.

    >>> tx_bytes_per_wire_byte("sum", 4), tx_bytes_per_wire_byte("gather", 4)
    (1.5, 3)
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if combine == "sum":
        return 2 * (ranks - 1) / ranks
    if combine == "gather":
        return ranks - 1
    raise ValueError(f"combine must be 'sum' or 'gather', got {combine!r}")


@dataclass(frozen=True)
class CollectiveCall:
    """Collectives of one kind and size that a rank called outside the training step."""

    op: str
    buffer_bytes: int
    element_bytes: int
    calls: int
    root: int = 0

    def traffic(self, ranks: int, rank: int) -> RankTraffic:
        """What `rank` sends for all these calls together."""
        one = rank_traffic(
            self.op, self.buffer_bytes, ranks, rank, self.element_bytes, root=self.root
        )
        return one.times(self.calls)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the run summary's `traffic.collectives_outside_steps`)."""
        return dataclasses.asdict(self)


class CollectiveLedger:
    """Counts the collectives a rank calls eagerly (broadcasts, validation sums, gathers).

    The training step's own collective runs inside a `tf.function` and is counted by the
    trainer (`gradient_bytes_wire`); everything else that `Exchange` sends is recorded here,
    so the fleet's byte accounting can model each device's traffic call by call.
    """

    def __init__(self) -> None:
        self._calls: Counter[tuple[str, int, int, int]] = Counter()

    def record(self, op: str, buffer_bytes: int, element_bytes: int = 1, root: int = 0) -> None:
        """One call of `op` on a buffer of `buffer_bytes` (this rank's contribution)."""
        if op not in COLLECTIVE_OPS:
            raise ValueError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVE_OPS)}")
        self._calls[(op, int(buffer_bytes), int(element_bytes), int(root))] += 1

    def calls(self) -> list[CollectiveCall]:
        """Every distinct (op, size, element size, root) with its number of calls, sorted."""
        return [
            CollectiveCall(op, buffer_bytes, element_bytes, count, root)
            for (op, buffer_bytes, element_bytes, root), count in sorted(self._calls.items())
        ]


def calls_from_dicts(entries: list[dict[str, Any]]) -> list[CollectiveCall]:
    """Inverse of `CollectiveCall.to_dict` for a list (read back from a run summary)."""
    return [CollectiveCall(**entry) for entry in entries]


@dataclass(frozen=True)
class RunCollectives:
    """A run's collectives as its summary records them, and what each rank sent in them."""

    ranks: int
    steps: int
    gradient_bytes_wire: int
    combine: str
    collectives_per_step: int
    element_bytes: int
    collectives_outside_steps: tuple[CollectiveCall, ...]
    devices: tuple[str, ...] = ()
    horovod_started_unix_seconds: float | None = None

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> RunCollectives:
        """Read a run summary (old summaries without `exchange`: combine from compression)."""
        for name in ("gradient_bytes_wire", "steps", "ranks"):
            if name not in summary:
                raise ValueError(f"run summary lacks {name!r}; fields present: {sorted(summary)}")
        exchange = summary.get("exchange") or {}
        compression = summary.get("compression") or {}
        combine = exchange.get("combine") or _combine_from_compression(compression)
        traffic = summary.get("traffic") or {}
        return cls(
            ranks=int(summary["ranks"]),
            steps=int(summary["steps"]),
            gradient_bytes_wire=int(summary["gradient_bytes_wire"]),
            combine=combine,
            collectives_per_step=int(exchange.get("collectives_per_step", 1)),
            element_bytes=(2 if compression.get("quantize") == "fp16" else 4)
            if combine == "sum"
            else 1,
            collectives_outside_steps=tuple(
                calls_from_dicts(list(traffic.get("collectives_outside_steps", [])))
            ),
            devices=tuple(summary.get("devices") or ()),
            horovod_started_unix_seconds=exchange.get("horovod_started_unix_seconds"),
        )

    @property
    def tx_bytes_per_wire_byte(self) -> float:
        """The step collective's factor: ring allreduce 2(N-1)/N, ring allgather N-1."""
        return tx_bytes_per_wire_byte(self.combine, self.ranks)

    def gradient_traffic(self, rank: int) -> RankTraffic:
        """What `rank` sent for the step's gradients over the run, framing counted."""
        if self.steps <= 0:
            return RankTraffic()
        if self.combine == "sum":
            per_step = self.gradient_bytes_wire // self.steps
            one = rank_traffic("allreduce", per_step, self.ranks, rank, self.element_bytes)
            return one.times(self.steps)
        # A variable-length payload sends its 4-byte length in an allgather of its own first.
        length_bytes = 4 if self.collectives_per_step > 1 else 0
        payload_per_step = (self.gradient_bytes_wire - length_bytes * self.steps) // self.steps
        one = rank_traffic("allgather", payload_per_step, self.ranks, rank)
        if length_bytes:
            one = one + rank_traffic("allgather", length_bytes, self.ranks, rank)
        return one.times(self.steps)

    def other_traffic(self, rank: int) -> RankTraffic:
        """What `rank` sent in every collective outside the steps (broadcasts, sums, gathers)."""
        total = RankTraffic()
        for call in self.collectives_outside_steps:
            total = total + call.traffic(self.ranks, rank)
        return total

    def rank_of(self, device: str) -> int | None:
        """The device's rank from the summary's device names (None when not listed once)."""
        return self.devices.index(device) if self.devices.count(device) == 1 else None

    def tx_bytes(self, traffic_of: Callable[[int], RankTraffic], rank: int | None) -> float:
        """`traffic_of(rank)`'s bytes sent; the mean over ranks when the rank is unknown."""
        if rank is not None:
            return float(traffic_of(rank).tx_bytes)
        return statistics.fmean(traffic_of(r).tx_bytes for r in range(self.ranks))


def _combine_from_compression(compression: Mapping[str, Any]) -> str:
    """How a summary without `exchange` combined: dense fp32/fp16 summed, the rest gathered."""
    if not compression:
        return "sum"
    dense = compression.get("prune", "none") == "none"
    return "sum" if dense and compression.get("quantize", "none") in ("none", "fp16") else "gather"
