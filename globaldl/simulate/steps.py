"""The reduced step model: training rounds composed from simulated message times, per device.

Each round, every device computes under its CFS quota (`cpu.CfsQuota`); Horovod's background
loop runs coordination cycles back to back, each cycle one chain of single messages per
process set (see `exchange` and `collectives.Coordination`); the cycle that finds every
device's tensors ready starts the collective, whose ring hops are composed from SimGrid's
per-message times by the ring's data dependencies. The next round starts where the
collective ends (or, with overlap, compute runs one round ahead, except across an epoch's end,
where the training loop drains the round in flight: `Workload.epoch_steps`; the projections
leave it None, an epoch long enough not to matter, and the unreduced `protocol` has no epochs).

An epoch's end runs the loop's own collectives: the epoch's training totals, validation (seconds
of compute), then the validation totals, one allreduce of three numbers over every rank
(`Trainer.end_epoch`), after which the round's steps go on. That small allreduce's result
reaches the ranks a ring hop or more apart, so they resume apart and the round's exchange starts
late. The model runs that allreduce (`collectives.totals_allreduce_of`) where an epoch ends
inside a round, or before the round after one it ends with, and leaves out of the round's time
what the epoch's end took on rank 0, as the fleet's phases leave validation out; validation's
compute and the training totals' allreduce before it (whose spread validation absorbs) are not
simulated. It explains a part of what the fleet shows: rounds-host, LeNet, 4 devices on 50 ms
links, H = 16, prune+quantize, a round's exchange after an epoch's end took 1.90-1.99 s (21
rounds of three runs) against 1.68-1.77 s in the 66 others; the simulated round there is 0.07 s
longer than the others (1.88 s against 1.82 s).

A tensor made from a collective's result reaches Horovod's queue only after the loop has
begun its next cycle: the loop goes from the collective's end straight into that cycle (its
cycle time has long passed), while the result first has to wake the training thread, which
then works on it and enqueues. So such a tensor waits for that cycle to end, then for a cycle of
its own (`HANDOFF_SECONDS`). Every round's tensors are made so: without overlap, from the
compute that starts with the round before's result (which takes longer than the handoff but
for a round with no compute: the fleet's one-float allreduce probe, issued again as each one
returns, pays that extra cycle every time); with overlap, round t+1's delta, which a device
hands to Horovod only once round t has finished (`local_sgd.overlap`: one exchange in flight
per process, so every rank submits in the same order); and a summed round after the first
(PowerSGD's Q, computed from the summed P). The hierarchy's operations pass each result
on unchanged and are not made to wait so; that is read from the fleet's hierarchy runs (with
the wait they would be simulated half again too slow), not from Horovod's source.

What makes 10,000 devices cheap (checked against the unreduced, message-by-message SimGrid
simulation in `protocol` on small fleets): SimGrid simulates one hop of each phase (its
independent messages reduced to one per class), the chain is a max-plus recurrence solved with
cumulative maxima (O(N) per cycle), a ring costs O(N) per hop, and rounds are simulated only
until the round time is steady (at most the requested steps).

Gloo's timeout applies to each single wait for a message; the model records the longest wait
of any rank, in the coordination chain or in a collective hop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from globaldl.simulate.collectives import (
    Collective,
    Coordination,
    chain_sends,
    collective_of,
    coordination_of,
    totals_allreduce_of,
)
from globaldl.simulate.cpu import CFS_PERIOD_SECONDS, CfsQuota
from globaldl.simulate.exchange import (
    ExchangeMode,
    ExchangeParameters,
    Hops,
    collective_tx_bytes,
)
from globaldl.simulate.platform import Fleet

# Ethernet frames carry 1448 TCP payload bytes in 1514; every second segment received is
# acknowledged by a 66-byte frame (Linux delayed ACKs).
FRAME_OVERHEAD = 1514 / 1448
ACK_BYTES_PER_RECEIVED_BYTE = 66 / (2 * 1448)
MIN_ROUNDS = 3
QUOTA_PERIODS_MEASURED = 20
STEADY_TOLERANCE = 0.02
MAX_CYCLES_PER_ROUND = 200_000
# A tensor made from a collective's result reaches Horovod this long after that collective
# finished (a thread wakes, works on the result, and enqueues): any time after the loop's next
# cycle began. Its size barely matters; that it is not zero does.
HANDOFF_SECONDS = 1e-3
# An epoch's totals, as `Trainer.end_epoch` sums them: three float64 (loss sum, correct, count).
EPOCH_TOTALS_BYTES = 3 * 8


@dataclass(frozen=True)
class Workload:
    """One exchange's payload and what each device computes around it."""

    payload_bytes: float
    cycle_time_seconds: float
    compute_cpu_seconds: np.ndarray  # per device: CPU-seconds of one step's non-exchange phases
    # Steps between the training loop's epoch ends, where a round in flight is drained and the
    # epoch's totals are summed (None: no epoch ends; see `simulate_steps`).
    epoch_steps: int | None = None

    def __post_init__(self) -> None:
        if not self.payload_bytes >= 0:
            raise ValueError(f"payload_bytes must be >= 0, got {self.payload_bytes!r}")
        if not self.cycle_time_seconds > 0:
            raise ValueError(f"cycle_time_seconds must be > 0, got {self.cycle_time_seconds!r}")
        if np.any(np.asarray(self.compute_cpu_seconds) < 0):
            raise ValueError("compute_cpu_seconds must be >= 0")
        if self.epoch_steps is not None and self.epoch_steps < 1:
            raise ValueError(f"epoch_steps must be >= 1 or None, got {self.epoch_steps!r}")


@dataclass(frozen=True)
class StepEstimate:
    """A simulated training step (a round divided by its H steps), steady state."""

    step_seconds: float
    compute_seconds: float
    coordination_seconds: float
    collective_seconds: float
    cycles_per_step: float
    cpu_seconds_per_step: float
    device_tx_bytes_per_step: float
    max_device_tx_bytes_per_step: float
    longest_wait_seconds: float
    longest_wait_in: str
    timed_out: bool
    simulated_steps: int
    # Each simulated round's wall as the training loop sees it, from the end of the round before
    # (the loop's own round end: the collective's end, or with overlap its compute done and the
    # round before's exchange back) to its own: a run's `round_local_seconds` plus
    # `round_sync_seconds`.
    round_seconds: tuple[float, ...] = ()

    @property
    def exchange_seconds(self) -> float:
        """Step time not spent computing (waiting for cycles, coordination, collective)."""
        return max(self.step_seconds - self.compute_seconds, 0.0)

    @property
    def timeout_reason(self) -> str:
        """Why the run would time out, or an empty string."""
        if not self.timed_out:
            return ""
        return (
            f"a rank waits {self.longest_wait_seconds:.1f} s for one message of the "
            f"{self.longest_wait_in}, over Gloo's timeout"
        )


@dataclass
class _Loops:
    """The state of every rank's background loop and CPU between rounds."""

    cpu: CfsQuota
    loop_free: np.ndarray  # when each loop is free for a new cycle (after the last collective)
    last_cycle: np.ndarray  # when each loop last started a cycle
    longest_wait: float = 0.0
    longest_wait_in: str = "coordination chain"

    def note_wait(self, seconds: float, where: str) -> None:
        """Keep the longest single wait for a message seen so far."""
        if seconds > self.longest_wait:
            self.longest_wait, self.longest_wait_in = seconds, where


def _coordinate(
    loops: _Loops,
    compute_start: np.ndarray,
    work: np.ndarray,
    cycle_seconds: float,
    coordination: Coordination,
    cpu_per_cycle: np.ndarray,
    message_cpu: np.ndarray,
    rng: np.random.Generator,
    submitted_after: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Run cycles until one finds every rank's tensors in: (ready, collective start, cycles).

    The training thread computes between cycles and the loop's CPU is reserved at each cycle's
    start, so both draw on the same quota in time order; a throttled device's loop waits.
    A tensor is in when its compute is done (`ready`, returned) and, if given, not before
    `submitted_after`.
    """
    not_before = -np.inf if submitted_after is None else submitted_after
    cpu, ranks = loops.cpu, len(work)
    position, remaining = compute_start, work
    ready = np.full(ranks, np.inf)
    entry = np.maximum(loops.loop_free, loops.last_cycle + cycle_seconds)
    cycles = 0
    while True:
        position, remaining = cpu.advance(position, remaining, entry)
        ready = np.where(np.isinf(ready) & (remaining <= 0), position, ready)
        entry = cpu.available_at(entry)
        started = cpu.run(entry, cpu_per_cycle)
        done, wait, where = coordination.run(started, message_cpu, rng)
        loops.note_wait(wait, where)
        cycles += 1
        if np.all(np.maximum(ready, not_before) <= entry) or cycles >= MAX_CYCLES_PER_ROUND:
            loops.last_cycle = entry
            return ready, done, cycles
        entry = np.maximum(done, entry + cycle_seconds)


def simulate_steps(
    fleet: Fleet,
    mode: ExchangeMode,
    workload: Workload,
    parameters: ExchangeParameters,
    network: dict[str, Hops],
    max_steps: int = 100,
) -> StepEstimate:
    """Simulate training rounds until the round time is steady (at most `max_steps` steps)."""
    ranks = fleet.size
    local_steps = mode.local_steps
    speeds = np.array([device.speed for device in fleet.devices])
    rng = np.random.default_rng(parameters.jitter_seed)
    cpu = CfsQuota(
        np.array([device.cpu_cores for device in fleet.devices]),
        rng.uniform(0.0, CFS_PERIOD_SECONDS, ranks),
        rate=fleet.device_rates(),
    )
    work = np.asarray(workload.compute_cpu_seconds, float) / speeds * local_steps
    max_rounds = max(MIN_ROUNDS, math.ceil(max_steps / local_steps))
    if ranks < 2:
        return _single_device(cpu, work, local_steps, max_rounds)
    message_cpu = parameters.message_cpu_seconds / speeds
    cycle = coordination_of(fleet, mode, network)
    cpu_per_cycle = (
        parameters.cycle_cpu_seconds + cycle.sends(ranks) * parameters.message_cpu_seconds
    ) / speeds
    collective = collective_of(fleet, mode, network, workload.payload_bytes)
    per_round = collective.operations()
    operations = per_round * mode.rounds
    messages = sum(operation.messages() for operation in operations)
    loops = _Loops(cpu, np.zeros(ranks), np.full(ranks, -np.inf))
    quota_bound = bool(np.any(cpu.binding))
    min_measured = QUOTA_PERIODS_MEASURED * CFS_PERIOD_SECONDS if quota_bound else 0.0
    compute_end = previous_end = older_end = np.zeros(ranks)
    durations, parts, loop_ends = [], [], []
    # With overlap, every epoch's end drains the round in flight (`RoundEngine.drain`: the loop
    # waits for it, so that validation sees every finished round): a round whose steps an epoch
    # ends inside stops there until the round before has finished; a round that ends with an
    # epoch is waited for before the next one starts. Either way the epoch's totals are then
    # summed (see the module's docstring): a round an epoch ends inside resumes when their
    # allreduce returns, one that follows an epoch's end starts then. The rounds then repeat
    # only every few epochs, so every round of the run is simulated (`max_steps`: the run's
    # steps).
    per_epoch = round_epoch_steps(mode, workload)
    totals = None if per_epoch is None else totals_allreduce_of(fleet, network, EPOCH_TOTALS_BYTES)
    ended = False  # whether an epoch ended with the round before
    for index in range(max_rounds):
        if mode.overlap:
            compute_start = np.maximum(compute_end, previous_end if ended else older_end)
        else:
            compute_start = previous_end
        resume, round_work, epoch_end = compute_start, work, 0.0
        if per_epoch is not None and totals is not None:
            inside, ends_with = _epoch_ends(index, local_steps, per_epoch)
            stop = compute_start
            if inside:
                stop = cpu.run(compute_start, work * inside / local_steps)
                if mode.overlap:
                    stop = np.maximum(stop, previous_end)
                round_work = work * (local_steps - inside) / local_steps
            if inside or ended:
                resume = _sum_epoch_totals(
                    loops, stop, totals, workload, cycle, cpu_per_cycle, message_cpu, rng
                )
                epoch_end = float(resume[0] - stop[0])
            ended = ends_with
        ready, started, cycles = _coordinate(
            loops,
            resume,
            round_work,
            workload.cycle_time_seconds,
            cycle,
            cpu_per_cycle,
            message_cpu,
            rng,
            previous_end + HANDOFF_SECONDS,
        )
        compute_end = ready
        # The collective's messages draw on the quota too (their time is in the ring's hops).
        # They are charged at its start, at most one period's quota: a long collective spreads
        # them thinly over many periods, where they throttle nothing.
        quota = cpu.cores * CFS_PERIOD_SECONDS
        # The exchange's Horovod operations in order: each summed round's (`mode.rounds`), and
        # within one the hierarchy's three (`Collective.operations`). Each after the first
        # carries tensors that exist only once the one before has finished: it waits for a
        # coordination cycle of its own. A summed round's tensors are computed from the round
        # before's result (PowerSGD's Q from P), so they are handed over after the loop's next
        # cycle began and wait for that cycle first; the hierarchy's next operation takes the
        # one before's output as it is, queued by TensorFlow's executor as its result comes.
        operation_start, finish = started, started
        for index, operation in enumerate(operations):
            if index:
                new_round = index % len(per_round) == 0
                _, operation_start, more = _coordinate(
                    loops,
                    finish,
                    np.zeros(ranks),
                    workload.cycle_time_seconds,
                    cycle,
                    cpu_per_cycle,
                    message_cpu,
                    rng,
                    finish + HANDOFF_SECONDS if new_round else None,
                )
                cycles += more
            cpu.run(operation_start, np.minimum(operation.messages() * message_cpu, quota))
            finish, wait = operation.finish(operation_start, message_cpu, rng)
            loops.note_wait(wait, "collective")
            loops.loop_free = finish
        # The epoch's end is no part of a step (the fleet's phases leave it out).
        durations.append(float(finish[0] - previous_end[0]) - epoch_end)
        comm_cpu = cycles * cpu_per_cycle + messages * message_cpu
        parts.append(
            (
                float(ready[0] - compute_start[0]) - epoch_end,
                float(started[0] - max(ready[0], compute_start[0])),
                float(finish[0] - started[0]),
                cycles,
                float(np.mean(work + comm_cpu)),
            )
        )
        # With overlap the loop ends a round once its compute is done and the round before's
        # exchange is back (`RoundEngine.end_round` waits for it, then submits this one's).
        loop_ends.append(float(max(ready[0], previous_end[0]) if mode.overlap else finish[0]))
        older_end, previous_end = previous_end, finish
        if per_epoch is None and _steady(durations, min_measured):
            break
    # The first round starts cold (every loop idle at time zero): leave it out when possible.
    measured = slice(1, None) if len(durations) > 1 else slice(None)
    compute, coordination, collective_seconds, cycles, cpu_seconds = np.mean(
        parts[measured], axis=0
    )
    tx = collective_tx_bytes(fleet, mode, workload.payload_bytes)
    wire = tx * (FRAME_OVERHEAD + ACK_BYTES_PER_RECEIVED_BYTE)
    # The measured bytes per cycle are a flat chain's; more process sets send more per cycle.
    chains = cycle.sends(ranks) / chain_sends(ranks)
    wire = wire + parameters.coordination_bytes_per_cycle * cycles * chains
    return StepEstimate(
        step_seconds=float(np.mean(durations[measured])) / local_steps,
        compute_seconds=float(compute) / local_steps,
        coordination_seconds=max(float(coordination), 0.0) / local_steps,
        collective_seconds=float(collective_seconds) / local_steps,
        cycles_per_step=float(cycles) / local_steps,
        cpu_seconds_per_step=float(cpu_seconds) / local_steps,
        device_tx_bytes_per_step=float(wire.mean()) / local_steps,
        max_device_tx_bytes_per_step=float(wire.max()) / local_steps,
        longest_wait_seconds=float(loops.longest_wait),
        longest_wait_in=loops.longest_wait_in,
        timed_out=bool(loops.longest_wait > parameters.gloo_timeout_seconds),
        simulated_steps=len(durations) * local_steps,
        round_seconds=tuple(np.diff(loop_ends, prepend=0.0).tolist()),
    )


def _sum_epoch_totals(
    loops: _Loops,
    handed: np.ndarray,
    totals: Collective,
    workload: Workload,
    coordination: Coordination,
    cpu_per_cycle: np.ndarray,
    message_cpu: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """When each rank has an epoch's totals, handed to Horovod at `handed` (per rank).

    Handed from the training thread like a round's delta (`HANDOFF_SECONDS`), they wait for a
    cycle that sees every rank's; the loop's next cycle starts as the allreduce ends.
    """
    _, started, _ = _coordinate(
        loops,
        handed,
        np.zeros(len(handed)),
        workload.cycle_time_seconds,
        coordination,
        cpu_per_cycle,
        message_cpu,
        rng,
        handed + HANDOFF_SECONDS,
    )
    finish, wait = totals.finish(started, message_cpu, rng)
    loops.note_wait(wait, "collective")
    loops.loop_free = finish
    return finish


def round_epoch_steps(mode: ExchangeMode, workload: Workload) -> int | None:
    """Steps between the epoch ends that touch `mode`'s rounds; None where none do.

    Only local steps make rounds that an epoch's end can fall inside, drain (with overlap) or
    hold up with its totals' allreduce; a workload without epochs (`epoch_steps` None, the
    projections') has none either.
    """
    return workload.epoch_steps if mode.local_steps > 1 else None


def _epoch_ends(round_index: int, local_steps: int, epoch_steps: int) -> tuple[int, bool]:
    """Where a round's epochs end: inside it (after how many steps; 0: none), and at its end.

    Returns the steps of the round before the first epoch end strictly inside it, and whether
    an epoch ends with the round's last step.
    """
    first, last = round_index * local_steps, (round_index + 1) * local_steps
    boundary = (first // epoch_steps + 1) * epoch_steps  # the first epoch end after `first`
    inside = boundary - first if boundary < last else 0
    return inside, last % epoch_steps == 0


def _steady(durations: list[float], min_measured_seconds: float = 0.0) -> bool:
    """Whether the mean round time is known well enough to stop simulating rounds.

    The first round is left out (it starts cold). Steady when the last measured rounds (two, or
    three once there are three) agree within STEADY_TOLERANCE, or, for rounds that keep varying
    (quota periods and jitter beat against the round), when the mean's standard error is within
    STEADY_TOLERANCE. Under a CPU quota the measured rounds must also span
    `min_measured_seconds` (QUOTA_PERIODS_MEASURED periods): rounds that fit a period's quota
    a few times can still overrun the quota's average rate.
    """
    measured = np.array(durations[1:])
    if len(measured) < MIN_ROUNDS - 1 or measured.sum() < min_measured_seconds:
        return False
    last = measured[-3:]
    if np.ptp(last) <= STEADY_TOLERANCE * last.mean():
        return True
    spread = measured.std(ddof=1) / math.sqrt(len(measured))
    return len(measured) >= 8 and bool(spread <= STEADY_TOLERANCE * measured.mean())


def _single_device(
    cpu: CfsQuota, work: np.ndarray, local_steps: int, max_rounds: int
) -> StepEstimate:
    """One device: no exchange, only compute under its quota."""
    ends, durations = np.zeros(1), []
    for _ in range(max_rounds):
        finished = cpu.run(ends, work)
        durations.append(float(finished[0] - ends[0]))
        ends = finished
        if _steady(durations, QUOTA_PERIODS_MEASURED * CFS_PERIOD_SECONDS):
            break
    step = float(np.mean(durations[1:] if len(durations) > 1 else durations)) / local_steps
    return StepEstimate(
        step_seconds=step,
        compute_seconds=step,
        coordination_seconds=0.0,
        collective_seconds=0.0,
        cycles_per_step=0.0,
        cpu_seconds_per_step=float(work[0]) / local_steps,
        device_tx_bytes_per_step=0.0,
        max_device_tx_bytes_per_step=0.0,
        longest_wait_seconds=0.0,
        longest_wait_in="",
        timed_out=False,
        simulated_steps=len(durations) * local_steps,
    )
