"""The unreduced simulation: every rank an actor in SimGrid, every Gloo message a real transfer.

This is the reference the reduced step model (`steps`) is checked against on small fleets. Each
rank runs Horovod's background loop: a coordination cycle every HOROVOD_CYCLE_TIME at most,
each cycle the bitwise-AND chain of Gloo's allreduce (rank N-1 down to rank 0, then rank 0 to
N-1 and down to rank 1, one message at a time), and once every rank's tensors are in, the
collective's ring, message by message, each waiting for the neighbour's message one or two
before it (the allgather keeps one in flight, the allreduce's segments two). Compute (in a
training actor of its own), Gloo's per-message CPU and the loop's per-cycle CPU run through
each device's CFS quota. Every pair of ranks talks over one connection, as Gloo's pairs do: a
connection actor pushes each message's bytes through SimGrid (the platform's rates and shared
links) after the previous message's and once the receiver's "ready to receive" has come back
over the return route (Gloo's rendezvous), and the message then arrives after its route's
latency and jitter; its bytes take at least BBR's pacing time (`exchange.paced_seconds`), the
connection held meanwhile. Covers flat rings (allreduce
and allgather), local steps and overlap; the hierarchical exchange is composed of the same
rings, and summed rounds (one collective after another in one exchange) are refused.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from globaldl.simulate.collectives import ring_segments
from globaldl.simulate.cpu import CFS_PERIOD_SECONDS, CfsQuota
from globaldl.simulate.engine import build_platform, run_in_child, start_engine
from globaldl.simulate.exchange import (
    COORDINATION_MESSAGE_BYTES,
    ExchangeMode,
    ExchangeParameters,
    paced_seconds,
    ring_messages,
)
from globaldl.simulate.platform import Fleet
from globaldl.simulate.steps import HANDOFF_SECONDS, Workload
from globaldl.simulate.topology import Link, Platform, route_latency_seconds

# The training thread's compute is handed to the CFS model in slices this long, so that the
# background loop's messages in between draw on the same quota as they would on the device.
COMPUTE_SLICE_SECONDS = 0.001


@dataclass(frozen=True)
class ProtocolRun:
    """What the unreduced simulation measured."""

    round_end_seconds: np.ndarray  # rank 0's collective end, per round
    collective_start_seconds: np.ndarray  # rank 0's collective start, per round
    cycles_per_round: np.ndarray
    longest_wait_seconds: float
    longest_wait_in: str
    local_steps: int

    @property
    def step_seconds(self) -> float:
        """Mean step time, leaving out the first round (every loop starts idle at time zero)."""
        durations = np.diff(np.concatenate([[0.0], self.round_end_seconds]))
        measured = durations[1:] if len(durations) > 1 else durations
        return float(measured.mean()) / self.local_steps


def simulate_protocol(
    fleet: Fleet,
    mode: ExchangeMode,
    workload: Workload,
    parameters: ExchangeParameters,
    rounds: int = 8,
) -> ProtocolRun:
    """Run `rounds` exchange rounds of `mode` on `fleet`, message by message, in SimGrid."""
    if mode.hierarchy != "none":
        raise ValueError("the unreduced simulation covers flat rings only (hierarchy='none')")
    if mode.rounds != 1:
        raise ValueError(
            f"the unreduced simulation runs one collective per exchange (rounds=1), got "
            f"rounds={mode.rounds}: summed rounds (PowerSGD's P then Q) are the reduced "
            "model's only"
        )
    if fleet.size < 2:
        raise ValueError("the unreduced simulation needs at least 2 ranks")
    if rounds < 2:
        raise ValueError(f"rounds must be >= 2, got {rounds}")
    return run_in_child(_simulate, fleet, mode, workload, parameters, rounds)


def _transfer_platform(platform: Platform) -> Platform:
    """The platform with every latency at zero: SimGrid pushes the bytes, latency is added after."""

    def no_latency(links: tuple[Link, ...]) -> tuple[Link, ...]:
        return tuple(Link(link.bytes_per_second, 0.0) for link in links)

    return replace(
        platform,
        device_up=no_latency(platform.device_up),
        device_down=no_latency(platform.device_down),
        site_up=no_latency(platform.site_up),
        site_down=no_latency(platform.site_down),
    )


def _simulate(
    fleet: Fleet,
    mode: ExchangeMode,
    workload: Workload,
    parameters: ExchangeParameters,
    rounds: int,
) -> ProtocolRun:
    ranks = fleet.size
    platform = fleet.platform()
    simgrid, engine = start_engine(parameters.engine_tcp())
    hosts = build_platform(simgrid, _transfer_platform(platform))
    # The same random draws as the reduced model: CFS period phases first.
    rng = np.random.default_rng(parameters.jitter_seed)
    cpu = CfsQuota(
        np.array([device.cpu_cores for device in fleet.devices]),
        rng.uniform(0.0, CFS_PERIOD_SECONDS, ranks),
        rate=fleet.device_rates(),
    )
    speeds = np.array([device.speed for device in fleet.devices])
    work = np.asarray(workload.compute_cpu_seconds, float) / speeds * mode.local_steps
    message_cpu = parameters.message_cpu_seconds / speeds
    cycle_cpu = parameters.cycle_cpu_seconds / speeds
    ring = ring_messages(mode.combine, workload.payload_bytes, ranks)
    hops, message_bytes, in_flight = ring.count, math.ceil(ring.message_bytes), ring.in_flight
    segments = (
        ring_segments(ranks, [list(range(ranks))], workload.payload_bytes)
        if mode.combine == "sum"
        else None
    )
    every = np.ones(ranks, dtype=bool)
    traffic = [
        segments.traffic(hop) if segments is not None else (every, every) for hop in range(hops)
    ]
    senders = np.arange(ranks)
    neighbour = (senders - 1) % ranks  # every rank sends to rank - 1 (rank 0 to rank N-1)
    latency = route_latency_seconds(platform, senders, neighbour)
    # Rank p receives from rank p+1: its "ready to receive" travels the route p -> p+1.
    notify = route_latency_seconds(platform, senders, (senders + 1) % ranks)
    # BBR paces each ring message over its connection's round trip: there and back.
    back = route_latency_seconds(platform, neighbour, senders)
    paced = paced_seconds(float(message_bytes), in_flight, latency + back)
    up_jitter, down_jitter = fleet.jitter_seconds_each_way()
    jitter = up_jitter + down_jitter[neighbour]
    outgoing = [(collections.deque(), simgrid.Semaphore(0)) for _ in range(ranks)]
    inboxes: dict[tuple[str, int], Any] = {}
    readies: dict[tuple[str, int], Any] = {}
    for kind in ("chain", "ring"):
        for rank in range(ranks):
            inboxes[kind, rank] = (collections.deque(), simgrid.Semaphore(0))
            readies[kind, rank] = (collections.deque(), simgrid.Semaphore(0))
    ends = np.zeros((ranks, rounds))
    starts = np.zeros((ranks, rounds))
    cycles = np.zeros(rounds)
    longest = {"seconds": 0.0, "in": "coordination chain"}

    def now() -> float:
        return float(engine.clock)

    def spend(rank: int, seconds: float) -> None:
        finish = cpu.run(np.array([now()]), np.array([seconds]), np.array([rank]))[0]
        simgrid.this_actor.sleep_until(finish)

    def connection(rank: int) -> None:
        """Rank's connection to rank - 1: one message at a time, each once rank - 1 is ready.

        The bytes go through SimGrid, then the message takes its latency to arrive; the
        sender learns that its bytes are out (Gloo's `waitSend`) through the message's semaphore.
        """
        queue, queued = outgoing[rank]
        target = int(neighbour[rank])
        while True:
            queued.acquire()
            kind, size, value, delay, least, out = queue.popleft()
            known, ready = readies[kind, target]
            ready.acquire()
            simgrid.this_actor.sleep_until(max(now(), known.popleft()))
            started = now()
            simgrid.Comm.sendto(hosts[rank], hosts[target], size)
            simgrid.this_actor.sleep_until(max(now(), started + least))
            out.release()
            arrival = now() + max(delay + rng.uniform(-jitter[rank], jitter[rank]), 0.0)
            inbox, arrived = inboxes[kind, target]
            inbox.append((arrival, value))
            arrived.release()

    def send(kind: str, rank: int, size: int, value: Any, delay: float, least: float = 0.0) -> Any:
        """Hand a message to the rank's connection; returns what `waitSend` waits on.

        `least`: the fewest seconds its bytes take to leave (TCP's pacing).
        """
        spend(rank, message_cpu[rank])
        queue, queued = outgoing[rank]
        out = simgrid.Semaphore(0)
        queue.append((kind, size, value, delay, least, out))
        queued.release()
        return out

    def post(kind: str, rank: int) -> None:
        """Post a receive: rank's sender learns of it one return latency later."""
        known, ready = readies[kind, rank]
        known.append(now() + float(notify[rank]))
        ready.release()

    def receive(kind: str, rank: int, what: str) -> Any:
        started = now()
        inbox, arrived = inboxes[kind, rank]
        arrived.acquire()
        arrival, value = inbox.popleft()
        simgrid.this_actor.sleep_until(max(now(), arrival))
        if now() - started > longest["seconds"]:
            longest["seconds"], longest["in"] = now() - started, what
        return value

    def coordination(rank: int, ready: bool) -> bool:
        """One bitwise-AND allreduce of the ready bits along Gloo's chain."""
        value = ready
        small = COORDINATION_MESSAGE_BYTES
        if rank < ranks - 1:
            # Receive first: the rank's own bit must not short-circuit the message away.
            post("chain", rank)
            upstream = receive("chain", rank, "coordination chain")
            value = bool(upstream) and value
        if rank > 0:
            send("chain", rank, small, value, float(latency[rank]))
            post("chain", rank)
            value = receive("chain", rank, "coordination chain")
            if rank >= 2:
                send("chain", rank, small, value, float(latency[rank]))
        else:
            send("chain", 0, small, value, float(latency[0]))
        return bool(value)

    def collective(rank: int) -> None:
        """Gloo's ring: hop k is posted once hop k - in_flight's receive and send are done.

        A hop whose segments lie past the buffer's end sends, receives and waits for nothing.
        """
        going: collections.deque[Any] = collections.deque()
        for hop in range(hops + in_flight):
            if hop >= in_flight:  # Gloo waits for the receive, then for the send
                sends, receives = traffic[hop - in_flight]
                if receives[rank]:
                    receive("ring", rank, "collective")
                if sends[rank]:
                    going.popleft().acquire()
            if hop < hops:
                sends, receives = traffic[hop]
                if receives[rank]:
                    post("ring", rank)
                if sends[rank]:
                    least = float(paced[rank])
                    message = send("ring", rank, message_bytes, None, float(latency[rank]), least)
                    going.append(message)

    ready_times: list[list[float]] = [[] for _ in range(ranks)]
    collective_done = [simgrid.Semaphore(0) for _ in range(ranks)]

    def trainer(rank: int) -> None:
        """The training thread: computes each round in slices, sharing the quota with the loop."""
        for round_index in range(rounds):
            # Without overlap a round computes after the previous collective; with overlap it
            # may run one round ahead of the exchange.
            if round_index >= (2 if mode.overlap else 1):
                collective_done[rank].acquire()
            remaining = work[rank]
            while remaining > 0:
                piece = min(COMPUTE_SLICE_SECONDS, remaining)
                spend(rank, piece)
                remaining -= piece
            ready_times[rank].append(now())

    def loop(rank: int) -> None:
        """Horovod's background loop: cycles until the round's tensors are in, then the ring."""
        last_cycle = -math.inf
        for round_index in range(rounds):
            while True:
                simgrid.this_actor.sleep_until(max(now(), last_cycle + workload.cycle_time_seconds))
                simgrid.this_actor.sleep_until(cpu.available_at(np.array([now()]), [rank])[0])
                last_cycle = now()
                done = ready_times[rank]
                # A round's tensors reach Horovod only after the round before has finished
                # (see `steps`): its result starts the compute, or with overlap its end
                # hands the next delta over.
                handed_over = not round_index or (
                    ends[rank, round_index - 1] + HANDOFF_SECONDS <= last_cycle
                )
                ready = len(done) > round_index and done[round_index] <= last_cycle and handed_over
                spend(rank, cycle_cpu[rank])
                if rank == 0:
                    cycles[round_index] += 1
                if coordination(rank, ready):
                    break
            starts[rank, round_index] = now()
            collective(rank)
            ends[rank, round_index] = now()
            collective_done[rank].release()

    for rank in range(ranks):
        simgrid.Actor.create(f"loop-{rank}", hosts[rank], loop, rank)
        simgrid.Actor.create(f"trainer-{rank}", hosts[rank], trainer, rank)
        simgrid.Actor.create(f"connection-{rank}", hosts[rank], connection, rank).daemonize()
    engine.run()
    return ProtocolRun(
        ends[0], starts[0], cycles, longest["seconds"], longest["in"], mode.local_steps
    )
