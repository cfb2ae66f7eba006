"""What a run report shows: each rank's totals, the epochs, and each device's bottleneck."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median

from globaldl.monitoring.phases import PHASES, bottleneck_phase, own_seconds_per_step
from globaldl.monitoring.promql import Series


@dataclass(frozen=True)
class RankTotals:
    """What one rank did over the run."""

    rank: int
    device: str
    steps: float
    skipped_steps: float
    examples: float
    phase_seconds: dict[str, float]
    gradient_bytes_raw: float
    gradient_bytes_wire: float
    # The first step's phases (counted in phase_seconds too), when the source recorded them.
    first_step_phase_seconds: dict[str, float] | None = None

    @property
    def steady_phase_seconds_per_step(self) -> dict[str, float]:
        """Mean seconds per step in each phase, the first step left out when it is known.

        The first step traces the graph and waits for Horovod's first negotiation (seconds on
        a slow device, on every rank): in a short run it would outweigh the steady steps.
        """
        first, steps = self.first_step_phase_seconds, self.steps
        if first is None or steps < 2:
            return {phase: seconds / steps for phase, seconds in self.phase_seconds.items()}
        return {
            phase: max(seconds - first.get(phase, 0.0), 0.0) / (steps - 1)
            for phase, seconds in self.phase_seconds.items()
        }

    @property
    def step_seconds(self) -> float:
        """Mean seconds per step (steady: see steady_phase_seconds_per_step)."""
        return sum(self.steady_phase_seconds_per_step.values()) if self.steps else math.nan

    @property
    def local_step_seconds(self) -> float:
        """Mean seconds per step outside the exchange (where a fast rank waits for the slowest)."""
        if not self.steps:
            return math.nan
        per_step = self.steady_phase_seconds_per_step
        return sum(seconds for phase, seconds in per_step.items() if phase != "exchange")


@dataclass(frozen=True)
class EpochPoint:
    """One epoch of a run summary's history."""

    epoch: int
    loss: float
    val_loss: float
    val_accuracy: float
    examples_per_second: float


@dataclass(frozen=True)
class DeviceBottleneck:
    """A device's bottleneck: the phase with the largest share of its own step time."""

    device: str
    phase: str
    share: float
    phase_seconds_per_step: float
    own_step_seconds: float
    peer_wait_seconds: float

    def sentence(self) -> str:
        """The bottleneck in one sentence."""
        waiting = (
            f"; it also waited {1000 * self.peer_wait_seconds:.1f} ms per step for slower peers"
            if self.peer_wait_seconds >= 0.0005
            else ""
        )
        return (
            f"On {self.device}, the bottleneck is {self.phase}: {self.share:.0%} of its own step "
            f"time ({1000 * self.phase_seconds_per_step:.1f} ms of "
            f"{1000 * self.own_step_seconds:.1f} ms per step{waiting})."
        )


@dataclass(frozen=True)
class DeviceProfile:
    """A device's mean seconds per step over its ranks: own time per phase, and peer waiting.

    The exchange in `own_seconds` is its transfer time; `peer_wait_seconds` is what the
    device's ranks spent in the exchange beyond that, waiting for slower peers.
    """

    device: str
    own_seconds: dict[str, float]
    peer_wait_seconds: float

    def bottleneck(self) -> DeviceBottleneck | None:
        """The device's bottleneck (bottleneck_phase of its own time); None without any time."""
        own_step_seconds = sum(self.own_seconds.values())
        if own_step_seconds <= 0:
            return None
        phase = bottleneck_phase(self.own_seconds)
        return DeviceBottleneck(
            self.device,
            phase,
            self.own_seconds[phase] / own_step_seconds,
            self.own_seconds[phase],
            own_step_seconds,
            self.peer_wait_seconds,
        )


@dataclass
class RunData:
    """Everything a report shows about one run, from either source."""

    run_id: str
    source: str
    ranks: list[RankTotals]
    epochs: list[EpochPoint] = field(default_factory=list)
    series: dict[str, list[Series]] = field(default_factory=dict)
    """Time series by view (Prometheus only), e.g. "throughput" -> one Series per device."""
    round_handovers: list[list[float]] = field(default_factory=list)
    """Per rank (rank order), when its loop handed each round's delta over (Unix seconds; run
    summaries with local steps record it: `rounds.rank_round_unix_seconds`)."""
    rank_devices: list[str] = field(default_factory=list)
    """Each rank's device name, in rank order, where the source records them."""

    def rank_device(self, rank: int) -> str | None:
        """Rank `rank`'s device name; None where the source records none."""
        return self.rank_devices[rank] if rank < len(self.rank_devices) else None

    def devices(self) -> list[str]:
        """Device names in first-rank order."""
        return list(dict.fromkeys(rank.device for rank in sorted(self.ranks, key=lambda r: r.rank)))

    def device_phase_seconds(self, device: str) -> dict[str, float]:
        """Seconds per phase summed over the device's ranks."""
        totals = dict.fromkeys(PHASES, 0.0)
        for rank in self.ranks:
            if rank.device == device:
                for phase, seconds in rank.phase_seconds.items():
                    totals[phase] += seconds
        return totals

    def device_steps(self, device: str) -> float:
        """Steps summed over the device's ranks."""
        return sum(rank.steps for rank in self.ranks if rank.device == device)


def device_profiles(run: RunData) -> list[DeviceProfile]:
    """Each device's own seconds per step and waiting for peers (see own_seconds_per_step)."""
    per_rank = {
        (rank.device, rank.rank): rank.steady_phase_seconds_per_step
        for rank in run.ranks
        if rank.steps > 0
    }
    own = own_seconds_per_step(per_rank)
    profiles = []
    for device in run.devices():
        keys = [key for key in own if key[0] == device]
        if not keys:
            continue
        own_seconds = {phase: sum(own[key][phase] for key in keys) / len(keys) for phase in PHASES}
        measured_exchange = sum(per_rank[key].get("exchange", 0.0) for key in keys) / len(keys)
        profiles.append(
            DeviceProfile(device, own_seconds, measured_exchange - own_seconds["exchange"])
        )
    return profiles


def device_bottlenecks(run: RunData) -> list[DeviceBottleneck]:
    """The bottleneck of every device that measured some step time.

    The rule of globaldl.monitoring.phases: the exchange counts its transfer time only
    (own_seconds_per_step), then bottleneck_phase names the phase with the largest share.
    """
    found = (profile.bottleneck() for profile in device_profiles(run))
    return [bottleneck for bottleneck in found if bottleneck is not None]


@dataclass(frozen=True)
class RankHandovers:
    """How one rank handed its rounds over against the first rank to hand each one over."""

    rank: int
    device: str
    rounds: int
    rounds_last: int  # rounds this rank handed over last (a tie counts for each rank in it)
    median_after_first_seconds: float
    max_after_first_seconds: float


def round_lateness(run: RunData) -> list[list[float]]:
    """Per round (in order), each rank's hand-over less the round's first, in rank order.

    The exchange of a round can start only once its last rank has handed its delta over: the
    ranks before it wait that long. Rounds some rank did not record are left out (a run that
    stopped mid-round).
    """
    if len(run.round_handovers) < 2:
        return []
    rounds = min(len(times) for times in run.round_handovers)
    lateness = []
    for index in range(rounds):
        handed = [times[index] for times in run.round_handovers]
        first = min(handed)
        lateness.append([time - first for time in handed])
    return lateness


def rank_handovers(run: RunData) -> list[RankHandovers]:
    """Each rank's hand-overs over the run (`round_lateness`), in rank order."""
    lateness = round_lateness(run)
    if not lateness:
        return []
    rows = []
    for rank in range(len(lateness[0])):
        own = [round_times[rank] for round_times in lateness]
        last = sum(1 for round_times in lateness if round_times[rank] == max(round_times))
        rows.append(
            RankHandovers(
                rank, run.rank_device(rank) or f"rank {rank}", len(own), last, median(own), max(own)
            )
        )
    return rows
