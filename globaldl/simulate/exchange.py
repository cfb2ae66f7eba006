"""The exchange as Horovod and Gloo run it: rings, coordination cycles, sites and local steps.

What each collective does on the wire (read from Gloo's and Horovod's sources):

- ring allreduce (Gloo `allreduce`): 2(N-1) hops; in each hop every rank sends 1/N of the
  buffer (two segments in flight) to its ring neighbour, and may only forward what it has
  received in the hop before.
- ring allgather (Gloo `allgatherv`): N-1 hops of one rank's payload each.
- broadcast: a binomial tree, ceil(log2 N) hops of the whole buffer.
- coordination (Horovod's background loop, response cache hit): once per cycle a bitwise-AND
  allreduce of one 8-byte word. Gloo's ring sends that word along a chain of 2(N-1) single
  messages, so its time is latency, not bandwidth. A collective waits for the next cycle
  (half a loop period on average) and its coordination.
- hierarchical (sum over sites): ring allreduce inside each site, ring allreduce of one leader
  per site across the WAN (2(S-1) hops), broadcast inside each site.
- local steps: one exchange every H steps; with overlap it runs behind the next round.

Reduction that makes 10,000 devices tractable: every hop of a ring moves the same sizes
between the same neighbours, so SimGrid simulates ONE hop with all N messages in flight at once
(their contention on shared site links is what it computes), and the 2(N-1) hops are composed
from those per-message times by the ring's data dependencies (`ring_completion_seconds`).
Identical steps are simulated once. `engine.simulate_ring` runs the unreduced ring for checks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from globaldl.simulate.engine import Phase, TcpModel, simulate_phases
from globaldl.simulate.platform import Fleet

# Horovod's coordination word, plus Gloo's per-message header: one TCP segment.
COORDINATION_MESSAGE_BYTES = 8
# A message that fits TCP's initial window (10 segments) arrives in one flight: one latency.
INITIAL_WINDOW_BYTES = 10 * 1448
HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS = 30.0
COMBINES = ("sum", "gather")
HIERARCHIES = ("none", "sites")
# Horovod's background loop never gets the whole CPU share; this floor keeps a device that it
# would starve from taking infinitely long per message (the CPU scheduler still runs it).
MIN_AVAILABLE_SHARE = 0.1


@dataclass(frozen=True)
class ExchangeMode:
    """How gradients cross the network: the collective, the hierarchy, and local steps."""

    name: str
    combine: str = "sum"
    hierarchy: str = "none"
    local_steps: int = 1
    overlap: bool = False

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise ValueError(f"combine must be one of {COMBINES}, got {self.combine!r}")
        if self.hierarchy not in HIERARCHIES:
            raise ValueError(f"hierarchy must be one of {HIERARCHIES}, got {self.hierarchy!r}")
        if self.hierarchy == "sites" and self.combine != "sum":
            raise ValueError("the hierarchical exchange needs a summable payload (combine='sum')")
        if not isinstance(self.local_steps, int) or self.local_steps < 1:
            raise ValueError(f"local_steps must be an integer >= 1, got {self.local_steps!r}")


@dataclass(frozen=True)
class ExchangeParameters:
    """What the exchange model needs beyond the platform; calibration fits some of these."""

    tcp: TcpModel = field(default_factory=TcpModel)
    message_cpu_seconds: float = 0.0
    cycle_cpu_seconds: float = 0.0
    bulk_message_seconds: float = 0.0
    coordination_bytes_per_cycle: float = 400.0
    gloo_timeout_seconds: float = HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS
    jitter_seed: int = 0

    def message_overhead_seconds(self, fleet: Fleet, cycle_time_seconds: float) -> np.ndarray:
        """Per device, the software time one message costs it (Gloo, syscalls, copies).

        It is CPU work done at the device's CPU share, less what Horovod's background loop
        burns every cycle: on a quarter core with a 1 ms cycle little is left for messages.
        """
        shares = np.array([device.cpu_cores * device.speed for device in fleet.devices])
        background_cores = self.cycle_cpu_seconds / cycle_time_seconds
        available = np.maximum(shares - background_cores, MIN_AVAILABLE_SHARE * shares)
        return self.message_cpu_seconds / available

    def small_message_tcp(self) -> TcpModel:
        """The TCP model for messages within one initial window: no slow-start latency."""
        return replace(self.tcp, latency_factor=1.0)


@dataclass(frozen=True)
class Workload:
    """One exchange's payload and the steps around it."""

    payload_bytes: float
    cycle_time_seconds: float
    compute_seconds: np.ndarray  # per device, every non-exchange phase of one step

    def __post_init__(self) -> None:
        if not self.payload_bytes >= 0:
            raise ValueError(f"payload_bytes must be >= 0, got {self.payload_bytes!r}")
        if not self.cycle_time_seconds > 0:
            raise ValueError(f"cycle_time_seconds must be > 0, got {self.cycle_time_seconds!r}")


@dataclass(frozen=True)
class StepEstimate:
    """One simulated training step (averaged over a round when steps are local)."""

    step_seconds: float
    compute_seconds: float
    exchange_seconds: float
    cycle_wait_seconds: float
    coordination_seconds: float
    collective_seconds: float
    device_tx_bytes_per_step: float
    max_device_tx_bytes_per_step: float
    longest_wait_seconds: float
    timed_out: bool
    timeout_reason: str = ""

    def as_row(self) -> dict[str, float | bool | str]:
        """Plain-data form for tables."""
        return dict(self.__dict__)


@dataclass
class NetworkPlan:
    """The phases one estimate needs SimGrid for, before they are simulated."""

    fleet: Fleet
    bulk: dict[str, Phase] = field(default_factory=dict)
    small: dict[str, Phase] = field(default_factory=dict)


def ring_phase(order: Sequence[int], message_bytes: float) -> Phase:
    """One hop of a ring over `order`: every rank sends to the next one, all at once."""
    order = list(order)
    return Phase.of(order, order[1:] + order[:1], [math.ceil(message_bytes)] * len(order))


def ring_completion_seconds(
    hop_seconds: np.ndarray,
    hops: int,
    start_seconds: np.ndarray | None = None,
    jitter_seconds: np.ndarray | None = None,
    seed: int = 0,
) -> float:
    """When the last rank of a ring finishes `hops` hops.

    `hop_seconds[i]` is how long rank i's message to rank i+1 takes. Rank i may send hop k once
    its own hop k-1 is out and it has received hop k-1 from rank i-1, so
    finish[i, k] = max(finish[i, k-1], finish[i-1, k-1]) + hop_seconds[i] (+ jitter).
    """
    ranks = len(hop_seconds)
    if hops <= 0 or ranks < 2:
        return float(np.max(start_seconds)) if start_seconds is not None else 0.0
    finish = np.zeros(ranks) if start_seconds is None else np.asarray(start_seconds, float).copy()
    rng = np.random.default_rng(seed)
    jitter = None if jitter_seconds is None or not np.any(jitter_seconds) else jitter_seconds
    for _ in range(hops):
        ready = np.maximum(finish, np.roll(finish, 1))
        finish = ready + hop_seconds
        if jitter is not None:
            finish = finish + rng.uniform(-1.0, 1.0, ranks) * jitter
    return float(finish.max())


def coordination_chain_seconds(hop_seconds: np.ndarray) -> float:
    """One coordination allreduce: its word passes every link of the ring twice, one at a time."""
    ranks = len(hop_seconds)
    if ranks < 2:
        return 0.0
    return float(2 * (ranks - 1) / ranks * hop_seconds.sum())


def plan_network(fleet: Fleet, mode: ExchangeMode, payload_bytes: float) -> NetworkPlan:
    """The message phases `mode` needs for `payload_bytes` per device on `fleet`."""
    plan = NetworkPlan(fleet)
    ranks = list(range(fleet.size))
    if fleet.size < 2:
        return plan
    plan.small["coordination"] = ring_phase(ranks, COORDINATION_MESSAGE_BYTES)
    if mode.hierarchy == "sites" and fleet.sites:
        groups = fleet.members()
        local = [Phase.of([], [], [])]
        for group in groups:
            if len(group) > 1:
                local.append(ring_phase(group, payload_bytes / len(group)))
        plan.bulk["site_ring"] = _merge(local)
        leaders = [group[0] for group in groups]
        if len(leaders) > 1:
            plan.bulk["wan_ring"] = ring_phase(leaders, payload_bytes / len(leaders))
        plan.bulk["site_broadcast"] = _merge(
            [
                Phase.of(
                    [group[0]] * (len(group) - 1),
                    group[1:],
                    [math.ceil(payload_bytes)] * (len(group) - 1),
                )
                for group in groups
                if len(group) > 1
            ]
            or [Phase.of([], [], [])]
        )
        return plan
    if mode.combine == "sum":
        plan.bulk["ring"] = ring_phase(ranks, payload_bytes / fleet.size)
    else:
        plan.bulk["ring"] = ring_phase(ranks, payload_bytes)
    return plan


def _merge(phases: Sequence[Phase]) -> Phase:
    return Phase(
        np.concatenate([phase.sources for phase in phases]),
        np.concatenate([phase.targets for phase in phases]),
        np.concatenate([phase.sizes_bytes for phase in phases]),
    )


def simulate_plans(
    plans: Sequence[NetworkPlan], parameters: ExchangeParameters
) -> list[dict[str, np.ndarray]]:
    """Simulate every plan's phases in SimGrid: one child process per TCP model for all plans.

    The plans' fleets become disjoint parts of one platform; their phases run one after the
    other, so none disturbs another.
    """
    from globaldl.simulate.platform import Fleet as _Fleet  # noqa: F401 (documentation)

    results: list[dict[str, np.ndarray]] = [{} for _ in plans]
    for kind, tcp in (("bulk", parameters.tcp), ("small", parameters.small_message_tcp())):
        platform, offsets = _combined_platform(plans)
        phases, owners = [], []
        for index, plan in enumerate(plans):
            for name, phase in getattr(plan, kind).items():
                shift = offsets[index]
                phases.append(
                    Phase(phase.sources + shift, phase.targets + shift, phase.sizes_bytes)
                )
                owners.append((index, name))
        if not phases:
            continue
        for (index, name), seconds in zip(
            owners, simulate_phases(platform, phases, tcp), strict=True
        ):
            results[index][name] = seconds
    return results


def _combined_platform(plans: Sequence[NetworkPlan]):  # type: ignore[no-untyped-def]
    from globaldl.simulate.engine import Platform

    up, down, site_of, site_up, site_down, offsets = [], [], [], [], [], []
    for plan in plans:
        platform = plan.fleet.platform()
        offsets.append(len(up))
        base = len(site_up)
        up.extend(platform.device_up)
        down.extend(platform.device_down)
        site_of.extend(site + base if site >= 0 else -1 for site in platform.site_of_device)
        site_up.extend(platform.site_up)
        site_down.extend(platform.site_down)
    combined = Platform(tuple(up), tuple(down), tuple(site_of), tuple(site_up), tuple(site_down))
    return combined, offsets


def estimate_step(
    fleet: Fleet,
    mode: ExchangeMode,
    workload: Workload,
    parameters: ExchangeParameters,
    network: dict[str, np.ndarray],
) -> StepEstimate:
    """Compose one step from simulated message times, the cycle and the devices' compute."""
    ranks = fleet.size
    compute = np.asarray(workload.compute_seconds, float)
    slowest_compute = float(compute.max())
    if ranks < 2:
        return StepEstimate(
            slowest_compute, slowest_compute, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
        )
    overhead = parameters.message_overhead_seconds(fleet, workload.cycle_time_seconds)
    coordination = coordination_chain_seconds(network["coordination"] + overhead)
    loop_period = max(workload.cycle_time_seconds, coordination)
    cycle_wait = loop_period / 2
    jitter = fleet.jitter_seconds()
    collective, longest_hop, tx_bytes = _collective(
        fleet, mode, workload, parameters, network, jitter, overhead
    )
    exchange = cycle_wait + coordination + collective
    h = mode.local_steps
    if mode.overlap and h >= 1 and mode.local_steps > 1:
        round_seconds = max(h * slowest_compute, exchange)
    else:
        round_seconds = h * slowest_compute + exchange
    step = round_seconds / h
    cycles_per_step = step / loop_period
    coordination_tx = parameters.coordination_bytes_per_cycle * cycles_per_step
    # The coordination word's chain: the last rank waits for nearly the whole chain.
    longest_wait = max(longest_hop, coordination)
    timed_out = longest_wait > parameters.gloo_timeout_seconds
    reason = ""
    if timed_out:
        what = "a coordination allreduce" if coordination >= longest_hop else "one message"
        reason = (
            f"{what} keeps a rank waiting {longest_wait:.1f} s, over Gloo's "
            f"{parameters.gloo_timeout_seconds:g} s timeout"
        )
    return StepEstimate(
        step_seconds=step,
        compute_seconds=slowest_compute,
        exchange_seconds=step - slowest_compute,
        cycle_wait_seconds=cycle_wait / h,
        coordination_seconds=coordination / h,
        collective_seconds=collective / h,
        device_tx_bytes_per_step=float(tx_bytes.mean() / h + coordination_tx),
        max_device_tx_bytes_per_step=float(tx_bytes.max() / h + coordination_tx),
        longest_wait_seconds=longest_wait,
        timed_out=timed_out,
        timeout_reason=reason,
    )


def _collective(
    fleet: Fleet,
    mode: ExchangeMode,
    workload: Workload,
    parameters: ExchangeParameters,
    network: dict[str, np.ndarray],
    jitter: np.ndarray,
    overhead: np.ndarray,
) -> tuple[float, float, np.ndarray]:
    """(seconds, longest single message, bytes each device sends) of one exchange."""
    ranks = fleet.size
    seed = parameters.jitter_seed
    bulk = parameters.bulk_message_seconds
    tx = np.zeros(ranks)
    if mode.hierarchy == "sites" and fleet.sites:
        groups = fleet.members()
        seconds, longest = 0.0, 0.0
        site_hops = network.get("site_ring", np.zeros(0))
        position = 0
        local_finish = []
        for group in groups:
            if len(group) < 2:
                local_finish.append(0.0)
                continue
            hops = site_hops[position : position + len(group)] + overhead[group] + bulk
            position += len(group)
            local_finish.append(
                ring_completion_seconds(hops, 2 * (len(group) - 1), None, jitter[group], seed)
            )
            tx[group] += 2 * (len(group) - 1) * workload.payload_bytes / len(group)
            longest = max(longest, float(hops.max()))
        seconds += max(local_finish)
        if "wan_ring" in network:
            leaders = [group[0] for group in groups]
            hops = network["wan_ring"] + overhead[leaders] + bulk
            seconds += ring_completion_seconds(
                hops, 2 * (len(leaders) - 1), None, jitter[leaders], seed
            )
            tx[leaders] += 2 * (len(leaders) - 1) * workload.payload_bytes / len(leaders)
            longest = max(longest, float(hops.max()))
        if len(network.get("site_broadcast", [])):
            broadcast = network["site_broadcast"] + float(overhead.max()) + bulk
            # A binomial tree: log2(site size) rounds, each as long as one leader-to-member copy.
            largest = max(len(group) for group in groups)
            seconds += math.ceil(math.log2(largest)) * float(broadcast.max())
            for group in groups:
                tx[group[0]] += workload.payload_bytes * math.ceil(math.log2(max(len(group), 2)))
            longest = max(longest, float(broadcast.max()))
        return seconds, longest, tx
    message_bytes = (
        workload.payload_bytes / ranks if mode.combine == "sum" else workload.payload_bytes
    )
    hops_seconds = (
        network["ring"] + overhead + (bulk if message_bytes > INITIAL_WINDOW_BYTES else 0.0)
    )
    if mode.combine == "sum":
        hops = 2 * (ranks - 1)
        tx[:] = hops * workload.payload_bytes / ranks
    else:
        hops = ranks - 1
        tx[:] = hops * workload.payload_bytes
    seconds = ring_completion_seconds(hops_seconds, hops, None, jitter, seed)
    return seconds, float(hops_seconds.max()), tx
