"""Gloo's collectives in time: the coordination chain and the ring hops, per rank.

`chain_cycle` times one coordination allreduce of Horovod's response-cache word (a chain of
single messages, see `exchange`) as a max-plus recurrence solved with cumulative maxima, O(N);
`ring_finish` composes a ring's hops from each message's transfer, latency and jitter, O(N)
per hop. Both follow Gloo's rendezvous: a message leaves only once its receiver's "ready to
receive" has come back to the sender. A `Collective` is the ring stages of an exchange mode
plus a broadcast inside sites; a `Coordination` is what one cycle of Horovod's background loop
runs before any collective (one chain per process set, and with dynamic process sets their
agreement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from globaldl.simulate.exchange import (
    ALLREDUCE_MESSAGES_IN_FLIGHT,
    ExchangeMode,
    Hops,
    allreduce_filled_segments,
    allreduce_hop_traffic,
    allreduce_segments,
    ring_messages,
    site_groups,
)
from globaldl.simulate.platform import Fleet

# Random jitter values drawn per generator call in a ring (bounds the block's memory: 16 MB).
JITTER_BLOCK_VALUES = 2_000_000


def chain_cycle(
    entry_seconds: np.ndarray,
    hop_seconds: np.ndarray,
    message_cpu_seconds: np.ndarray,
    notify_seconds: np.ndarray,
) -> tuple[np.ndarray, float]:
    """One coordination allreduce of a word: when each rank is done, and the longest wait.

    `entry_seconds[p]` is when rank p enters; `hop_seconds[p]` is its message to rank p-1
    (rank 0's goes to rank N-1), and `notify_seconds[p]` how long rank p's "ready to receive"
    takes to reach the rank it receives from. A message leaves at max(sent, posted + n) for
    the receiver's posted receive. Reduce-scatter (receives posted on entry): x[N-1] = e[N-1] +
    c, and x[p] = max(x[p+1], e[p] + n[p]) + h[p+1] + c down to rank 0; allgather (posted when
    the rank's scatter is done): y[N-1] = max(max(x[0], x[N-1] + n[N-1]) + h[0], x[N-1]) + c,
    then y[p] = max(y[p+1], x[p] + n[p]) + h[p+1] + c down to rank 1. Each recurrence
    x[p] = max(x[p+1] + a[p], b[p]) is solved with a reversed cumulative max.
    """
    ranks = len(entry_seconds)
    cpu = np.broadcast_to(message_cpu_seconds, (ranks,))
    if ranks < 2:
        return entry_seconds.copy(), 0.0
    step = hop_seconds[1:] + cpu[:-1]  # a[p] for p = 0..N-2: message p+1 -> p, then p's CPU
    # When each rank's receive is known upstream: posted on entry for the scatter, once its
    # scatter is done for the gather. A message waits for it, so x[p] >= posted[p] + h + c.
    scatter_posted = entry_seconds + notify_seconds
    scatter_base = entry_seconds + cpu
    scatter_base[:-1] = scatter_posted[:-1] + step
    scatter = _chain(scatter_base, step)
    scatter_arrival = np.maximum(scatter[1:], scatter_posted[:-1]) + hop_seconds[1:]
    scatter_wait = np.maximum(scatter_arrival - entry_seconds[:-1], 0.0)
    gather_posted = scatter + notify_seconds
    last_arrival = max(scatter[0], gather_posted[-1]) + hop_seconds[0]
    last_start = max(last_arrival, scatter[-1]) + cpu[-1]
    gather_base = np.empty(ranks - 1)
    gather_base[:-1] = gather_posted[1:-1] + step[1:]
    gather_base[-1] = last_start
    gather = _chain(gather_base, step[1:])
    gather_arrival = np.maximum(gather[1:], gather_posted[1:-1]) + hop_seconds[2:]
    gather_wait = np.maximum(gather_arrival - scatter[1:-1], 0.0)
    last_wait = max(last_arrival - scatter[-1], 0.0)
    done = np.empty(ranks)
    done[0] = scatter[0] + cpu[0]
    done[1:] = gather
    longest = max(
        float(scatter_wait.max(initial=0.0)), float(gather_wait.max(initial=0.0)), last_wait
    )
    return done, longest


def _chain(base: np.ndarray, step: np.ndarray) -> np.ndarray:
    """x[p] = max(x[p+1] + step[p], base[p]), x[last] = base[last]."""
    suffix = np.zeros(len(base))
    suffix[:-1] = np.cumsum(step[::-1])[::-1]
    return suffix + np.maximum.accumulate((base - suffix)[::-1])[::-1]


@dataclass(frozen=True)
class Segments:
    """Where a ring allreduce's data lies, for `exchange.allreduce_hop_traffic`.

    Per rank: its ring position and size, its ring's segments per rank, and how many segments
    hold data. On one ring of every rank in order, hop i = s*m + b (s segments per rank) has
    rank r send segment s*(r+1+m) + b in the reduce-scatter and s*(r+m) + b in the allgather,
    and receive what rank r+1 sends: so each hop's pattern is a shifted window of one of s
    patterns, `pattern_b[q] = s*q + b < filled`, read as views of that pattern laid out twice.
    """

    position: np.ndarray
    ring_size: np.ndarray
    per_rank: np.ndarray
    filled: np.ndarray
    _windows: list[np.ndarray] | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        ranks = len(self.position)
        one_ring = (
            bool(np.all(self.ring_size == ranks))
            and np.array_equal(self.position, np.arange(ranks))
            and len(np.unique(self.per_rank)) == 1
            and len(np.unique(self.filled)) == 1
        )
        if one_ring:
            per_rank, filled = int(self.per_rank[0]), int(self.filled[0])
            windows = [
                np.tile(per_rank * np.arange(ranks) + offset < filled, 2)
                for offset in range(per_rank)
            ]
            for window in windows:
                window.flags.writeable = False
            object.__setattr__(self, "_windows", windows)

    @property
    def one_ring(self) -> bool:
        """Whether every rank is on one ring, in rank order (traffic read as shifted views)."""
        return self._windows is not None

    def traffic(self, hop: int) -> tuple[np.ndarray, np.ndarray]:
        """Per rank: whether it sends, and whether it receives, in `hop` (read-only arrays)."""
        if self._windows is None:
            return allreduce_hop_traffic(
                self.position, self.ring_size, self.per_rank, self.filled, hop
            )
        ranks, per_rank = len(self.position), len(self._windows)
        per_phase = (ranks - 1) * per_rank
        gather = hop >= per_phase
        rounds, offset = divmod(hop - per_phase if gather else hop, per_rank)
        shift = (rounds if gather else rounds + 1) % ranks
        window = self._windows[offset]
        return window[shift : shift + ranks], window[shift + 1 : shift + 1 + ranks]


@dataclass(frozen=True)
class RingStage:
    """Ring hops over some ranks: who each rank receives from, how long, and how many hops.

    `in_flight`: messages a rank keeps going at once. Gloo's allgather(v) waits for each hop's
    send and receive before the next (1); its allreduce posts segment i's once segment i-2's are
    done (2).
    """

    upstream: np.ndarray
    incoming_transfer_seconds: np.ndarray
    incoming_latency_seconds: np.ndarray
    incoming_jitter_seconds: np.ndarray
    hops: np.ndarray  # per rank; 0 for ranks outside this stage
    notify_seconds: np.ndarray  # per rank: its "ready to receive" on the way to its upstream
    in_flight: int = 1
    # An allreduce that leaves some segments empty: their hops carry nothing (None: all carry).
    segments: Segments | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.in_flight, int) or self.in_flight < 1:
            raise ValueError(f"in_flight must be an integer >= 1, got {self.in_flight!r}")

    @classmethod
    def of(
        cls,
        ranks: int,
        hops: Hops,
        upstream: np.ndarray,
        hop_count: np.ndarray,
        in_flight: int = 1,
        segments: Segments | None = None,
    ) -> RingStage:
        """The stage in which rank p receives the message `upstream[p]` sends in `hops`.

        A message's bytes take the link's time or, slower, BBR's pacing of `in_flight` of them
        at once (`Hops.sending_seconds`).
        """
        transfer, latency, jitter = np.zeros(ranks), np.zeros(ranks), np.zeros(ranks)
        notify = np.zeros(ranks)
        transfer[hops.phase.sources] = hops.sending_seconds(in_flight)
        latency[hops.phase.sources] = hops.latency_seconds
        jitter[hops.phase.sources] = hops.jitter_seconds
        notify[hops.phase.sources] = hops.notify_seconds
        return cls(
            upstream,
            transfer[upstream],
            latency[upstream],
            jitter[upstream],
            hop_count,
            notify[upstream],
            in_flight,
            segments,
        )

    def downstream(self) -> np.ndarray:
        """Per rank, the rank it sends to (itself for ranks outside the stage)."""
        downstream = np.arange(len(self.upstream))
        receivers = np.flatnonzero(self.hops > 0)
        downstream[self.upstream[receivers]] = receivers
        return downstream


def ring_finish(
    start_seconds: np.ndarray,
    stage: RingStage,
    message_cpu_seconds: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    """When each rank finishes the stage's hops, and the longest wait for one message.

    With d = `stage.in_flight`, rank p starts hop k (posts its receive, hands its message over)
    once hop k-1 has started and hop k-d's message has arrived and its own has left:
    s[p, k] = max(s[p, k-1], arrival[p, k-d], sent[p, k-d]) + cpu[p]; after its last hop it
    waits for the d still going the same way. Messages between two ranks share one TCP
    connection: the upstream rank pushes a message's bytes only after the previous message's
    (transfer) and once rank p's "ready to receive", sent when p starts the hop, has come back
    (Gloo's rendezvous); each message then takes its latency (and jitter) to arrive.
    """
    start = np.array(start_seconds, dtype=float, copy=True)
    ranks, most = len(start), int(stage.hops.max(initial=0))
    if most == 0:
        return start, 0.0
    depth = stage.in_flight
    jitter = stage.incoming_jitter_seconds
    jittered = bool(np.any(jitter > 0))
    every_rank = bool(np.all(stage.hops == most))
    in_stage = stage.hops > 0
    # A flat ring receives from the next rank: a shifted copy is cheaper than a gather.
    next_rank = bool(np.array_equal(stage.upstream, np.roll(np.arange(ranks), -1)))
    downstream = stage.downstream()
    pushed = np.full(ranks, -np.inf)  # when the upstream rank's previous bytes were out
    # Per hop mod d: the message's arrival at rank p, and when p's own message was out.
    arrivals = np.full((depth, ranks), -np.inf)
    departures = np.full((depth, ranks), -np.inf)
    upstream_start, arrival = np.empty(ranks), np.empty(ranks)
    posted = np.empty(ranks)  # when rank p's receive for this hop is known upstream
    longest = np.zeros(ranks)
    # Jittered delays are drawn for a block of hops at once: one generator call, not one per hop.
    block = max(1, min(most, JITTER_BLOCK_VALUES // max(ranks, 1)))
    delays = np.broadcast_to(stage.incoming_latency_seconds, (block, ranks))
    segments = stage.segments
    sends = receives = None
    charged = bool(np.any(message_cpu_seconds))
    candidate = np.empty(ranks)
    for hop in range(most + depth):
        slot = hop % depth
        if segments is not None and hop < most:
            sends, receives = segments.traffic(hop)
            if not every_rank:
                sends, receives = sends & (hop < stage.hops), receives & (hop < stage.hops)
        if hop:
            # Hop k starts once hop k-d's message is in and p's own has left; p has waited
            # for that message since hop k-1 started.
            waited = np.maximum(arrivals[slot] - start, 0.0)
            ready = np.maximum(np.maximum(start, arrivals[slot]), departures[slot])
            if sends is None or hop >= most:
                ready += message_cpu_seconds
            elif charged:
                ready += np.where(sends | receives, message_cpu_seconds, 0.0)
            if every_rank and hop < most:
                np.maximum(longest, waited, out=longest)
                start = ready
            else:
                active = in_stage & (hop < stage.hops + depth)
                np.maximum(longest, np.where(active, waited, 0.0), out=longest)
                start = np.where(active, ready, start)
        if hop >= most:
            arrivals[slot] = departures[slot] = -np.inf
            continue
        if jittered and hop % block == 0:
            noise = rng.uniform(-1.0, 1.0, (block, ranks)) * jitter
            delays = np.maximum(noise + stage.incoming_latency_seconds, 0.0)
        if next_rank:
            upstream_start[:-1] = start[1:]
            upstream_start[-1] = start[0]
        else:
            np.take(start, stage.upstream, out=upstream_start)
        np.add(start, stage.notify_seconds, out=posted)
        if receives is not None:
            # Only a hop that carries data uses the connection; an empty one leaves it be.
            np.maximum(upstream_start, pushed, out=candidate)
            np.maximum(candidate, posted, out=candidate)
            candidate += stage.incoming_transfer_seconds
            np.copyto(pushed, candidate, where=receives)
            arrivals[slot] = -np.inf
            np.add(pushed, delays[hop % block], out=arrivals[slot], where=receives)
            departures[slot] = -np.inf
            np.copyto(departures[slot], pushed[downstream], where=sends)
            continue
        np.maximum(upstream_start, pushed, out=pushed)
        np.maximum(posted, pushed, out=pushed)
        pushed += stage.incoming_transfer_seconds
        np.add(pushed, delays[hop % block], out=arrival)
        # Rank p's own message is the one its downstream receives.
        if every_rank:
            arrivals[slot] = arrival
            departures[slot] = pushed[downstream]
        else:
            sending = hop < stage.hops
            arrivals[slot] = np.where(sending, arrival, -np.inf)
            departures[slot] = np.where(sending, pushed[downstream], -np.inf)
    return start, float(longest.max(initial=0.0))


def sender_seconds(ranks: int, hops: Hops) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: seconds and jitter of the message it sends in this phase (0 if none)."""
    seconds, jitter = np.zeros(ranks), np.zeros(ranks)
    seconds[hops.phase.sources] = hops.seconds
    jitter[hops.phase.sources] = hops.jitter_seconds
    return seconds, jitter


def receiver_notify_seconds(ranks: int, hops: Hops) -> np.ndarray:
    """Per rank: how long its "ready to receive" takes to reach the rank it receives from."""
    notify = np.zeros(ranks)
    notify[hops.phase.targets] = hops.notify_seconds
    return notify


@dataclass(frozen=True)
class Chain:
    """One process set's coordination chain: its ranks in ring order and their messages.

    `seconds[i]`, `jitter[i]`: the message member i sends to member i-1; `notify[i]`: member
    i's "ready to receive" on its way to the member it receives from.
    """

    ranks: np.ndarray
    seconds: np.ndarray
    jitter: np.ndarray
    notify: np.ndarray
    where: str

    @classmethod
    def of(cls, ranks: int, hops: Hops, members: np.ndarray, where: str) -> Chain:
        """The chain over `members` (global ranks, ring order) from a phase's messages."""
        seconds, jitter = sender_seconds(ranks, hops)
        notify = receiver_notify_seconds(ranks, hops)
        return cls(members, seconds[members], jitter[members], notify[members], where)

    def run(
        self,
        done: np.ndarray,
        message_cpu_seconds: np.ndarray,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, float]:
        """Every rank's time after this chain (others unchanged), and the longest wait."""
        hop = self.seconds
        if np.any(self.jitter > 0):
            hop = np.maximum(hop + rng.uniform(-1.0, 1.0, len(hop)) * self.jitter, 0.0)
        finished, wait = chain_cycle(
            done[self.ranks], hop, message_cpu_seconds[self.ranks], self.notify
        )
        done = done.copy()
        done[self.ranks] = finished
        return done, wait


@dataclass(frozen=True)
class Coordination:
    """What one cycle of Horovod's background loop runs on the network, in its order.

    Horovod 0.28.1's `RunLoopOnce` (operations.cc): with dynamic process sets (the hierarchy's,
    `hvd.init(process_sets="dynamic")`) every rank first allgathers two integers over the
    global set (process_set.cc, `InitializeRegisteredAndRemoveMarkedIfReady`); then every
    process set a rank belongs to coordinates in turn (`ComputeResponseList`: the response
    cache's word allreduced over the set): the global set, each site's, the leaders'.
    A collective starts once the whole cycle is done (Horovod starts a set's ready collectives
    right after that set's coordination: a simplification).
    """

    chains: tuple[Chain, ...]
    agreement: Chain | None = None

    def sends(self, ranks: int) -> np.ndarray:
        """Messages each rank sends in one cycle."""
        sends = np.zeros(ranks)
        if self.agreement is not None:
            sends += ranks - 1
        for chain in self.chains:
            sends[chain.ranks] += chain_sends(len(chain.ranks))
        return sends

    def run(
        self,
        started: np.ndarray,
        message_cpu_seconds: np.ndarray,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, float, str]:
        """When each rank's cycle is done, the longest wait for one message, and where."""
        done, longest, where = started, 0.0, "coordination chain"
        if self.agreement is not None:
            agreement = self.agreement
            done = ring_allgather_word(
                done, agreement.seconds, agreement.notify, message_cpu_seconds
            )
        for chain in self.chains:
            done, wait = chain.run(done, message_cpu_seconds, rng)
            if wait > longest:
                longest, where = wait, chain.where
        return done, longest, where


def coordination_of(fleet: Fleet, mode: ExchangeMode, network: dict[str, Hops]) -> Coordination:
    """The coordination cycle of `mode` on `fleet`, from the simulated message times."""
    ranks = fleet.size
    every_rank = np.arange(ranks)
    global_chain = Chain.of(ranks, network["chain"], every_rank, "coordination chain")
    groups = site_groups(fleet, mode)
    if len(groups) == 1:
        return Coordination((global_chain,))
    sites = [
        Chain.of(ranks, network["site_chain"], np.asarray(group), "site coordination chain")
        for group in groups
        if len(group) > 1
    ]
    leaders = np.asarray([group[0] for group in groups])
    leader_chain = Chain.of(ranks, network["leader_chain"], leaders, "leaders' coordination chain")
    return Coordination((global_chain, *sites, leader_chain), agreement=global_chain)


@dataclass(frozen=True)
class Collective:
    """A collective as ring stages, then a broadcast from each rank's site leader."""

    stages: list[RingStage]
    leader: np.ndarray  # per rank, whose result it receives (itself in a flat ring)
    broadcast_rounds: np.ndarray
    broadcast_round_seconds: np.ndarray

    def messages(self) -> np.ndarray:
        """Messages each rank handles in one collective."""
        return sum(stage.hops for stage in self.stages) + self.broadcast_rounds

    def operations(self) -> list[Collective]:
        """The Horovod operations it runs one after the other, each on the one before's result.

        A flat ring is one. The hierarchy is three (`--hierarchy sites`): the sum in each site,
        the sum among the site leaders, the broadcast back into each site; each runs on its own
        process set and its tensors exist only once the one before has finished, so each
        waits for a coordination cycle of its own.
        """
        if len(self.stages) <= 1 and not np.any(self.broadcast_rounds):
            return [self]
        ranks = len(self.leader)
        identity, none = np.arange(ranks), np.zeros(ranks)
        rings = [Collective([stage], identity, none, none) for stage in self.stages]
        return [
            *rings,
            Collective([], self.leader, self.broadcast_rounds, self.broadcast_round_seconds),
        ]

    def finish(
        self, start_seconds: np.ndarray, message_cpu_seconds: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float]:
        """When each rank has the result, and the longest wait for one message."""
        finish, longest = start_seconds, 0.0
        for stage in self.stages:
            finish, wait = ring_finish(finish, stage, message_cpu_seconds, rng)
            longest = max(longest, wait)
        rounds = self.broadcast_rounds
        return finish[self.leader] + rounds * (
            self.broadcast_round_seconds + message_cpu_seconds
        ), longest


def collective_of(
    fleet: Fleet, mode: ExchangeMode, network: dict[str, Hops], payload_bytes: float
) -> Collective:
    """The collective of `mode` on `fleet`, from the simulated message times.

    `payload_bytes`: per device, as `plan_network` got it (it sets the allreduce's segments).
    """
    ranks = fleet.size
    collective_bytes = mode.collective_bytes(payload_bytes)
    groups = site_groups(fleet, mode)
    if len(groups) == 1:
        return _flat_ring(ranks, network["ring"], mode.combine, collective_bytes)
    rounds, round_seconds = np.zeros(ranks), np.zeros(ranks)
    leader = np.arange(ranks)
    stages = []
    for name, members in (("site_ring", groups), ("wan_ring", [[g[0] for g in groups]])):
        upstream, hops = np.arange(ranks), np.zeros(ranks, dtype=np.int64)
        for group in members:
            upstream[group] = np.roll(np.asarray(group), -1)
            hops[group] = ring_messages("sum", collective_bytes, len(group)).count
        segments = ring_segments(ranks, members, collective_bytes)
        stages.append(
            RingStage.of(
                ranks, network[name], upstream, hops, ALLREDUCE_MESSAGES_IN_FLIGHT, segments
            )
        )
    broadcast, _ = sender_seconds(ranks, network["site_broadcast"])
    for group in groups:
        leader[group] = group[0]
        rounds[group[1:]] = math.ceil(math.log2(len(group))) if len(group) > 1 else 0
        round_seconds[group] = broadcast[group[0]]
    return Collective(stages, leader, rounds, round_seconds)


def totals_allreduce_of(fleet: Fleet, network: dict[str, Hops], payload_bytes: float) -> Collective:
    """The small allreduce of `payload_bytes` an epoch's end runs over every rank, flat.

    The training loop's epoch totals (`Trainer.end_epoch`: `sum_across_ranks`, the global
    process set). Its segments are a few bytes, each hop one small message: the coordination
    word's hops carry them (`network["chain"]`, messages of a few bytes in ring order). Only the
    first segments hold data, so the result reaches the ranks one hop after another
    (`test_a_one_float_allreduce_travels_as_the_coordination_chain`).
    """
    return _flat_ring(fleet.size, network["chain"], "sum", payload_bytes)


def _flat_ring(ranks: int, hops_seconds: Hops, combine: str, collective_bytes: float) -> Collective:
    """One ring over every rank (allreduce or allgather), its hops timed by `hops_seconds`."""
    upstream = np.roll(np.arange(ranks), -1)
    ring = ring_messages(combine, collective_bytes, ranks)
    hops = np.full(ranks, ring.count)
    every = [list(range(ranks))]
    segments = ring_segments(ranks, every, collective_bytes) if combine == "sum" else None
    stage = RingStage.of(ranks, hops_seconds, upstream, hops, ring.in_flight, segments)
    return Collective([stage], np.arange(ranks), np.zeros(ranks), np.zeros(ranks))


def ring_segments(ranks: int, rings: list[list[int]], payload_bytes: float) -> Segments | None:
    """The segments of allreduce rings over `rings` (rank lists), or None if all hold data."""
    position, size = np.zeros(ranks, dtype=np.int64), np.ones(ranks, dtype=np.int64)
    per_rank, filled = np.ones(ranks, dtype=np.int64), np.ones(ranks, dtype=np.int64)
    skips = False
    for ring in rings:
        count = len(ring)
        position[ring], size[ring] = np.arange(count), count
        per_rank[ring] = allreduce_segments(payload_bytes, count)
        filled[ring] = allreduce_filled_segments(payload_bytes, count)
        skips |= count > 1 and filled[ring[0]] < per_rank[ring[0]] * count
    return Segments(position, size, per_rank, filled) if skips else None


def chain_sends(ranks: int) -> np.ndarray:
    """Messages each rank sends in one coordination chain.

    Rank 0 sends only the allgather's first message, rank 1 only its reduce-scatter message;
    every other rank sends one of each.
    """
    sends = np.full(ranks, 2.0)
    sends[: min(ranks, 2)] = 1.0
    return sends


def ring_allgather_word(
    entry_seconds: np.ndarray,
    hop_seconds: np.ndarray,
    notify_seconds: np.ndarray,
    message_cpu_seconds: np.ndarray,
) -> np.ndarray:
    """When each rank holds every rank's word after a ring allgather of one word each.

    Gloo's ring allgather runs N-1 hops; rank p forwards to rank p-1 what it received in the
    hop before. Small messages are timed as ring hops are: each pays the receiver's "ready to
    receive" on its way back (`notify_seconds[p]` from rank p) and the message's way there
    (`hop_seconds[p]`, rank p's message to rank p-1), then the receiver's CPU. The word of rank
    q+d reaches rank q after d such hops; rank q is done once the farthest word (d = N-1) and
    every nearer one have come, so done[q] = max over d of entry[q+d] plus the d hops between;
    and a rank that enters late still receives its N-1 words one hop after the other. Waits
    of a word behind a late rank in the middle of its way are not modelled (O(N), not O(N^2)):
    for ranks that enter together the result is the same.
    """
    ranks = len(entry_seconds)
    cpu = np.broadcast_to(message_cpu_seconds, (ranks,))
    if ranks < 2:
        return entry_seconds.copy()
    # hop[p]: rank p's word to rank p-1, the receiver's notification back, its CPU.
    hop = hop_seconds + np.roll(notify_seconds, 1) + np.roll(cpu, 1)
    doubled = np.concatenate([hop, hop])
    # reached[t] = hops t-1 down to ... : prefix[t] = hop[1] + ... + hop[t] (indices mod N).
    prefix = np.concatenate([[0.0], np.cumsum(doubled[1:])])
    arrivals = np.concatenate([entry_seconds, entry_seconds]) + prefix
    farthest = _window_max(arrivals[1:], ranks - 1)[:ranks]
    # A rank receives its N-1 words one after the other, each only once it has asked for it.
    own_pace = entry_seconds + (ranks - 1) * np.roll(hop, -1)
    return np.maximum(own_pace, farthest - prefix[:ranks])


def _window_max(values: np.ndarray, width: int) -> np.ndarray:
    """max(values[i : i + width]) for every i whose window fits (blocks of `width`, O(len))."""
    count = len(values)
    blocks = -(-count // width)
    padded = np.full(blocks * width, -np.inf)
    padded[:count] = values
    grid = padded.reshape(blocks, width)
    from_start = np.maximum.accumulate(grid, axis=1).ravel()
    to_end = np.maximum.accumulate(grid[:, ::-1], axis=1)[:, ::-1].ravel()
    starts = np.arange(count - width + 1)
    return np.maximum(to_end[starts], from_start[starts + width - 1])
