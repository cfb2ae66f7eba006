"""The exchange as Horovod 0.28.1 and its Gloo run it: which messages, between whom, how long.

What each collective does on the wire (read from Gloo's `allreduce.cc`, `allgatherv.cc` and
Horovod's `gloo_controller.cc`, `response_cache.cc`); rank r sends to rank r-1:

- ring allreduce (`allreduce.cc`'s `ring`): the buffer is cut into segments, at least two
  per rank and at most 1 MiB each (`allreduce_segments`); reduce-scatter, then allgather, each
  (N-1) x segments-per-rank messages of one segment to the ring neighbour, with two messages in
  flight: the rank posts the receive and the send of segment i as soon as segment i-2's are
  done, so it never waits for the message it has just asked for.
- ring allgather(v): N-1 hops of one rank's whole payload each.
- coordination (response cache hit, every cycle of Horovod's background loop): a bitwise-AND
  allreduce of ceil((cached tensors + 3) / 64) 64-bit words. Gloo splits any allreduce into
  2N segments of at least one element; an 8-byte buffer fills only segment 0, and Gloo skips
  every empty segment, so the word travels as a chain of single messages: N-1 of them from
  rank N-1 down to rank 0 (reduce-scatter), then N-1 from rank 0 to N-1 and down to rank 1
  (allgather). See `globaldl.simulate.steps` for its timing.
- hierarchical (sum over sites): ring allreduce inside each site, ring allreduce of one leader
  per site across the WAN, broadcast inside each site (a binomial tree): three Horovod
  operations on their process sets, each on the one before's result, so each after a
  coordination cycle of its own (see `globaldl.simulate.steps`). Horovod coordinates every
  process set in every cycle, one after the other: the global set's chain, each site's (over
  its LAN), the leaders' (2(S-1) WAN messages); with dynamic process sets, as the hierarchy
  runs, every cycle also starts with an allgather of two integers over all ranks (N-1 ring
  hops). See `globaldl.simulate.collectives.Coordination`.
- several summed rounds (PowerSGD: P, then Q): one collective each, in order, each after a
  coordination cycle; the payload split evenly between them.
- local steps: one exchange every H steps; with overlap it runs behind the next round.

Gloo's TCP transport is a rendezvous (`transport/tcp/pair.cc`): a send leaves only once the
receiver's "ready to receive" notification has reached the sender (`Pair::send` queues it until
`handleRemotePendingRecv`). Ring hops post their receive when the hop starts, so each costs
the notification's way back and the message's way there: two one-way latencies, not one; the
allreduce's two messages in flight share those two latencies between two segments. The
coordination chain's receivers post theirs on entry, long before the word comes by, so only a
message to a rank that entered late waits for its notification.

SimGrid gives each message's transfer time on the platform (one engine, latency factor 1:
every message pays its route's latency once). TCP adds what its congestion control does. The
fleet's kernel runs BBR (`tcp_congestion_control` in every run's machine record), measured on
the fleet's links with `globaldl fleet tcp` (README, "What TCP does on the fleet's links"): it
never restarts a window after the pauses between collectives (BBR's own control replaces the
kernel's slow start after idle), but a connection that carries only the exchange's flights is
application-limited and paces what it sends at `paced_seconds`. Where that pacing is faster
than the link, the link sets the time (SimGrid's); where slower (long round trips, small
flights), the pacing does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from globaldl.simulate.engine import TcpModel, simulate_phases
from globaldl.simulate.platform import Fleet
from globaldl.simulate.topology import Phase, Platform, route_latency_seconds

# Horovod's coordination word: one 64-bit word while fewer than 61 tensors are cached.
COORDINATION_MESSAGE_BYTES = 8
# TCP payload per segment on the fleet's 1500-byte links (timestamps on).
SEGMENT_BYTES = 1448
# BBR's pacing gain in STARTUP, 2/ln 2 (`bbr_high_gain`; ss shows pacing_gain:2.88672): an
# application-limited connection never sees the bandwidth plateau that ends STARTUP.
BBR_STARTUP_GAIN = 2 / math.log(2)
# TCP's initial window (RFC 6928), from which BBR sets its first pacing rate.
INITIAL_WINDOW_SEGMENTS = 10
# The segments BBR puts in one packet train (`bbr_min_tso_segs`): one below 1.2 Mbit/s of
# pacing (`bbr_min_tso_rate`), two above. After a pause the first train leaves at once.
BBR_MIN_TSO_RATE_BITS_PER_SECOND = 1_200_000
# Gloo's ring allreduce (`AllreduceOptions::kMaxSegmentSize`, and the messages it keeps going).
ALLREDUCE_MAX_SEGMENT_BYTES = 1024 * 1024
ALLREDUCE_MESSAGES_IN_FLIGHT = 2
# The summed payloads' element (float32, int32): Gloo's segments hold whole elements. fp16's
# 2-byte elements would split a buffer below 2N elements a little finer; no projection's
# payload is that small in fp16.
ALLREDUCE_ELEMENT_BYTES = 4
HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS = 30.0
COMBINES = ("sum", "gather")
HIERARCHIES = ("none", "sites")


@dataclass(frozen=True)
class ExchangeMode:
    """How gradients cross the network: the collective, the hierarchy, and local steps.

    `rounds`: collectives one exchange runs one after the other, each on the sum of the one
    before, so each waits for a coordination cycle of its own (PowerSGD: P, then Q); the
    payload is split evenly between them.
    """

    name: str
    combine: str = "sum"
    hierarchy: str = "none"
    local_steps: int = 1
    overlap: bool = False
    rounds: int = 1

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise ValueError(f"combine must be one of {COMBINES}, got {self.combine!r}")
        if self.hierarchy not in HIERARCHIES:
            raise ValueError(f"hierarchy must be one of {HIERARCHIES}, got {self.hierarchy!r}")
        if self.hierarchy == "sites" and self.combine != "sum":
            raise ValueError("the hierarchical exchange needs a summable payload (combine='sum')")
        if not isinstance(self.local_steps, int) or self.local_steps < 1:
            raise ValueError(f"local_steps must be an integer >= 1, got {self.local_steps!r}")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        if self.rounds > 1 and self.combine != "sum":
            raise ValueError("rounds > 1 are summed collectives (combine='sum')")

    def collective_bytes(self, payload_bytes: float) -> float:
        """What one of its collectives moves per device: an even share of the payload."""
        return payload_bytes / self.rounds


@dataclass(frozen=True)
class ExchangeParameters:
    """What the exchange model needs beyond the platform; calibration fits some of these.

    `tcp.bandwidth_factor` is fitted; SimGrid runs at latency factor 1 (every message pays its
    route's latency once; what TCP adds is `paced_seconds`).
    """

    tcp: TcpModel = field(default_factory=TcpModel)
    message_cpu_seconds: float = 0.0
    cycle_cpu_seconds: float = 0.0
    coordination_bytes_per_cycle: float = 400.0
    gloo_timeout_seconds: float = HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS
    jitter_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("message_cpu_seconds", "cycle_cpu_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.gloo_timeout_seconds > 0:
            raise ValueError(f"gloo_timeout_seconds must be > 0, got {self.gloo_timeout_seconds}")

    def engine_tcp(self) -> TcpModel:
        """The model SimGrid runs: the fitted bandwidth factor, latency paid once."""
        return replace(self.tcp, latency_factor=1.0)


def paced_seconds(
    message_bytes: np.ndarray | float,
    flight_messages: int,
    round_trip_seconds: np.ndarray | float,
) -> np.ndarray:
    """Least time BBR takes to let a message's bytes leave on an application-limited connection.

    A connection that sends flights of F bytes (`flight_messages` messages at once) and waits
    for more work between them never fills the link. BBR estimates its bandwidth as the
    delivery rate of those flights, b = F / (RTT + F / p), and, never leaving STARTUP (its
    samples never show a plateau), paces at p = g b with g its STARTUP gain, a rate that there
    only grows (`bbr_set_pacing_rate`), from g times the initial window per round trip
    (`bbr_init_pacing_rate_from_rtt`). It grows toward p = (g - 1) F / RTT, where the two
    agree, if that is higher. The first packet train (one segment, or two above 1.2 Mbit/s:
    `bbr_min_tso_segs`) leaves at once, the rest at p: a message of S bytes takes
    (S - train) / p, about half a round trip for a whole large flight. Measured on a 300 ms
    path (1.2 s round trip, 62 kB flights, model 0.78 Mbit/s): 0.55-0.71 Mbit/s in one run,
    1.08 in another; connections that carried only coordination words paced at 0.27 Mbit/s,
    the initial rate (README).
    """
    sizes = np.asarray(message_bytes, dtype=float)
    if np.any(~(sizes >= 0)):
        raise ValueError(f"message sizes must be >= 0 bytes, got {sizes[~(sizes >= 0)][:3]}")
    if not isinstance(flight_messages, int) or flight_messages < 1:
        raise ValueError(f"flight_messages must be an integer >= 1, got {flight_messages!r}")
    flight = np.maximum(flight_messages * sizes, 1.0)
    with np.errstate(divide="ignore"):  # no round trip (rates-only links): no pacing limit
        rate = np.maximum(
            (BBR_STARTUP_GAIN - 1) * flight,
            BBR_STARTUP_GAIN * INITIAL_WINDOW_SEGMENTS * SEGMENT_BYTES,
        ) / np.asarray(round_trip_seconds, dtype=float)
    train = np.where(rate * 8 < BBR_MIN_TSO_RATE_BITS_PER_SECOND, 1, 2) * SEGMENT_BYTES
    return np.maximum(sizes - train, 0.0) / rate


def allreduce_segments(payload_bytes: float, ranks: int) -> int:
    """Segments per rank of Gloo's ring allreduce of `payload_bytes` over `ranks`.

    Gloo cuts the buffer into segments of ceil(bytes / 2N) rounded up to whole elements, at
    most 1 MiB, and rounds their count up to a multiple of N, at least 2N: two per rank for
    buffers up to 2N MiB.
    """
    segment = _allreduce_segment_bytes(payload_bytes, ranks)
    count = max(math.ceil(payload_bytes / segment), 2 * ranks)
    return -(-count // ranks)


def allreduce_filled_segments(payload_bytes: float, ranks: int) -> int:
    """How many of the ring allreduce's segments hold any of `payload_bytes` (the first ones).

    The others lie past the buffer's end: Gloo neither sends nor receives them. Below 2N
    elements most segments are empty (one 4-byte float over 16 ranks fills one of 32).
    """
    return math.ceil(payload_bytes / _allreduce_segment_bytes(payload_bytes, ranks))


def _allreduce_segment_bytes(payload_bytes: float, ranks: int) -> int:
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if not payload_bytes >= 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes!r}")
    segment = min(math.ceil(payload_bytes / (2 * ranks)), ALLREDUCE_MAX_SEGMENT_BYTES)
    elements = max(1, math.ceil(segment / ALLREDUCE_ELEMENT_BYTES))
    return elements * ALLREDUCE_ELEMENT_BYTES


def allreduce_hop_traffic(
    position: np.ndarray,
    ring_size: np.ndarray,
    segments_per_rank: np.ndarray | int,
    filled: np.ndarray | int,
    hop: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per rank at ring `position` of `ring_size` ranks: whether it sends, receives in `hop`.

    Hops 0 .. (N-1)s-1 are the reduce-scatter, the next (N-1)s the allgather (s segments per
    rank). In reduce-scatter iteration i rank r sends segment (r+1)s+i and receives (r+2)s+i,
    in the allgather (r)s+i and (r+1)s+i, all mod Ns (Gloo's `allreduce.cc`); only the first
    `filled` segments hold data. What rank r sends in a hop is what rank r-1 receives in it.
    Every argument but `hop` is per rank (rings of different sizes side by side) or one value.
    """
    per_phase = (ring_size - 1) * segments_per_rank
    gather = hop >= per_phase
    iteration = np.where(gather, hop - per_phase, hop)
    first = np.where(gather, position, position + 1) * segments_per_rank + iteration
    total = ring_size * segments_per_rank
    sends = first % total < filled
    receives = (first + segments_per_rank) % total < filled
    return sends, receives


@dataclass(frozen=True)
class RingMessages:
    """One collective's ring over N ranks as Gloo runs it, per rank.

    `count` messages of `message_bytes` each, `in_flight` of them going at once (an
    allreduce's hops whose segments hold no data carry nothing: `allreduce_hop_traffic`).
    """

    count: int
    message_bytes: float
    in_flight: int


def ring_messages(combine: str, payload_bytes: float, ranks: int) -> RingMessages:
    """The ring that sums (`combine="sum"`) or gathers `payload_bytes` per rank over `ranks`.

    Allreduce: 2(N-1) hops per segment per rank, two in flight, the empty segments' hops
    carrying nothing; allgatherv: N-1 messages of a whole payload, one at a time.
    """
    if combine == "sum":
        segments = allreduce_segments(payload_bytes, ranks)
        return RingMessages(
            2 * (ranks - 1) * segments,
            payload_bytes / (ranks * segments),
            ALLREDUCE_MESSAGES_IN_FLIGHT,
        )
    return RingMessages(ranks - 1, payload_bytes, 1)


def ring_order_phase(order: Sequence[int], message_bytes: float) -> Phase:
    """One hop of Gloo's ring over `order`: position p sends to position p-1, all at once."""
    order = list(order)
    return Phase.of(order, order[-1:] + order[:-1], [math.ceil(message_bytes)] * len(order))


@dataclass
class NetworkPlan:
    """The message phases one exchange needs SimGrid for, named, before they are simulated."""

    fleet: Fleet
    phases: dict[str, Phase] = field(default_factory=dict)


def site_groups(fleet: Fleet, mode: ExchangeMode) -> list[list[int]]:
    """Rank groups of a hierarchical exchange (one per site and per device without a site)."""
    if mode.hierarchy == "sites" and fleet.sites:
        return fleet.members()
    return [list(range(fleet.size))]


def plan_network(fleet: Fleet, mode: ExchangeMode, payload_bytes: float) -> NetworkPlan:
    """The message phases `mode` needs for `payload_bytes` per device on `fleet`.

    With several rounds every round's collective moves its even share of the payload.
    """
    plan = NetworkPlan(fleet)
    ranks = list(range(fleet.size))
    if fleet.size < 2:
        return plan
    payload_bytes = mode.collective_bytes(payload_bytes)
    plan.phases["chain"] = ring_order_phase(ranks, COORDINATION_MESSAGE_BYTES)
    groups = site_groups(fleet, mode)
    if len(groups) > 1:
        local = [
            ring_order_phase(group, ring_messages("sum", payload_bytes, len(group)).message_bytes)
            for group in groups
            if len(group) > 1
        ]
        plan.phases["site_ring"] = _merge(local) if local else Phase.of([], [], [])
        leaders = [group[0] for group in groups]
        plan.phases["wan_ring"] = ring_order_phase(
            leaders, ring_messages("sum", payload_bytes, len(leaders)).message_bytes
        )
        # Each process set's coordination word: the sites' over their LANs, the leaders' over
        # the WAN (see `globaldl.simulate.collectives.Coordination`).
        words = [
            ring_order_phase(group, COORDINATION_MESSAGE_BYTES)
            for group in groups
            if len(group) > 1
        ]
        plan.phases["site_chain"] = _merge(words) if words else Phase.of([], [], [])
        plan.phases["leader_chain"] = ring_order_phase(leaders, COORDINATION_MESSAGE_BYTES)
        # A binomial broadcast: every round each holder sends one copy; one leader-to-member
        # copy per site gives a round's time.
        members = [group for group in groups if len(group) > 1]
        plan.phases["site_broadcast"] = Phase.of(
            [group[0] for group in members],
            [group[1] for group in members],
            [math.ceil(payload_bytes)] * len(members),
        )
        return plan
    ring = ring_messages(mode.combine, payload_bytes, fleet.size)
    plan.phases["ring"] = ring_order_phase(ranks, ring.message_bytes)
    return plan


def _merge(phases: Sequence[Phase]) -> Phase:
    return Phase(
        np.concatenate([phase.sources for phase in phases]),
        np.concatenate([phase.targets for phase in phases]),
        np.concatenate([phase.sizes_bytes for phase in phases]),
    )


@dataclass(frozen=True)
class Hops:
    """One phase's messages with their simulated seconds (SimGrid's, before TCP's pacing)."""

    phase: Phase
    transfer_seconds: np.ndarray  # pushing the bytes through the links (SimGrid)
    latency_seconds: np.ndarray  # route latency
    jitter_seconds: np.ndarray  # +- amplitude of each message's extra delay
    notify_seconds: np.ndarray  # the receiver's "ready to receive" back to the sender

    def sending_seconds(self, flight_messages: int = 1) -> np.ndarray:
        """Each message's bytes leaving: the link's time, or BBR's pacing where it is slower.

        `flight_messages`: how many such messages the connection sends at once.
        """
        round_trip = self.latency_seconds + self.notify_seconds
        paced = paced_seconds(self.phase.sizes_bytes, flight_messages, round_trip)
        return np.maximum(self.transfer_seconds, paced)

    @property
    def seconds(self) -> np.ndarray:
        """Each message's time from sending to arrival (one at a time), without jitter."""
        return self.sending_seconds() + self.latency_seconds


@dataclass(frozen=True)
class Transfers:
    """SimGrid's seconds for one phase's messages, before any fitted overhead is added."""

    phase: Phase
    simulated_seconds: np.ndarray
    route_latency_seconds: np.ndarray
    jitter_seconds: np.ndarray
    return_latency_seconds: np.ndarray  # the route back, receiver to sender

    def hops(self) -> Hops:
        """The messages' times: SimGrid's, its route latency split off."""
        latency = np.minimum(self.route_latency_seconds, self.simulated_seconds)
        return Hops(
            self.phase,
            transfer_seconds=self.simulated_seconds - latency,
            latency_seconds=latency,
            jitter_seconds=self.jitter_seconds,
            notify_seconds=self.return_latency_seconds,
        )


def simulate_transfers(plans: Sequence[NetworkPlan], tcp: TcpModel) -> list[dict[str, Transfers]]:
    """Every plan's phases through SimGrid (latency factor 1), all in one engine.

    Distinct fleets sit side by side on one platform (nothing connects them); plans on the same
    fleet object (one device count, several exchange modes) share its part. Phases run one
    after the other, so none disturbs another.
    """
    engine_tcp = replace(tcp, latency_factor=1.0)
    fleets: dict[int, Fleet] = {}
    for plan in plans:
        fleets.setdefault(id(plan.fleet), plan.fleet)
    platforms = {key: fleet.platform() for key, fleet in fleets.items()}
    union, offsets = Platform.union(list(platforms.values()))
    offset_of = dict(zip(platforms, offsets, strict=True))
    owners = [(index, name) for index, plan in enumerate(plans) for name in plan.phases]
    shifted = []
    for index, name in owners:
        phase, shift = plans[index].phases[name], offset_of[id(plans[index].fleet)]
        shifted.append(Phase(phase.sources + shift, phase.targets + shift, phase.sizes_bytes))
    seconds = simulate_phases(union, shifted, engine_tcp) if shifted else []
    jitter = {key: fleet.jitter_seconds_each_way() for key, fleet in fleets.items()}
    results: list[dict[str, Transfers]] = [{} for _ in plans]
    for (index, name), simulated in zip(owners, seconds, strict=True):
        plan = plans[index]
        phase = plan.phases[name]
        up_jitter, down_jitter = jitter[id(plan.fleet)]
        platform = platforms[id(plan.fleet)]
        results[index][name] = Transfers(
            phase,
            simulated,
            route_latency_seconds(platform, phase.sources, phase.targets),
            up_jitter[phase.sources] + down_jitter[phase.targets],
            route_latency_seconds(platform, phase.targets, phase.sources),
        )
    return results


def simulate_plans(
    plans: Sequence[NetworkPlan], parameters: ExchangeParameters
) -> list[dict[str, Hops]]:
    """Every plan's messages with SimGrid's times at the bandwidth factor of `parameters`."""
    return [
        {name: transfers.hops() for name, transfers in phases.items()}
        for phases in simulate_transfers(plans, parameters.tcp)
    ]


def collective_tx_bytes(fleet: Fleet, mode: ExchangeMode, payload_bytes: float) -> np.ndarray:
    """Bytes each device hands to the network in one exchange (payload only, no headers)."""
    ranks = fleet.size
    tx = np.zeros(ranks)
    if ranks < 2:
        return tx
    groups = site_groups(fleet, mode)
    if len(groups) > 1:
        for group in groups:
            size = len(group)
            tx[group] += 2 * (size - 1) * payload_bytes / size
            tx[group[0]] += payload_bytes * math.ceil(math.log2(max(size, 2))) * (size > 1)
        leaders = [group[0] for group in groups]
        tx[leaders] += 2 * (len(leaders) - 1) * payload_bytes / len(leaders)
        return tx
    if mode.combine == "sum":
        tx[:] = 2 * (ranks - 1) * payload_bytes / ranks
    else:
        tx[:] = (ranks - 1) * payload_bytes
    return tx
