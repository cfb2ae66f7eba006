"""The fleet's committed runs as observations the simulator can be calibrated and checked on.

Every `results/experiments/*/*.json` holds each run's summary (phase times, bytes handed to
Horovod, steps, accuracy history), its link profile, cycle time and byte accounting. A run
becomes an `Observation`: the configuration the simulator needs and the step time it must hit.

Each device's work per step is the CPU time of its non-exchange phases at full core speed (a CFS
quota does not slow a burst down, it stops it when the quota is spent; the simulator decides when).
The summaries hold wall times, so the CPU time is recovered with the quota's own rule: the phases
between two exchanges run as one burst, which starts with a full period's quota; a burst longer than
the quota ran the quota at full speed and the rest at the quota's rate
(`run_records.burst_cpu_seconds`). Runs whose summary carries `rank_totals` give every rank's own
phases (and their CPU seconds as a bound); older summaries hold rank 0's only, and the other ranks'
batch-bound phases (input, forward and backward) are moved along each model's measured cost per
example, a line through every run's rank-0 phases at the batches the runs used.

Newer summaries also carry each rank's process CPU inside its training steps
(`step_cpu_seconds` over `step_cpu_steps`). Where present it is the device's work per step
and the burst rule is not used: the rule assumes a burst starts with a full period's quota,
which a device whose step is bound by its quota never has (its step then lasts about one CFS
period, and the rule overstates its CPU). That CPU includes what Horovod's thread spent during
the exchange, a small share the simulator's per-message CPU also counts.

The simulator predicts the steady step; a run's first step also waits for the slowest rank to
trace its graph and for Horovod's first negotiation (on a delayed link, several seconds: a
12-step run's mean carries a tenth of it). Summaries that record each rank's first step
(`first_step_phase_seconds`) give the observation their other steps' phases; older ones give
the mean over every step. An epoch's start makes the ranks wait for the last one out of the
epoch's end, inside their exchange phase; the last rank's phases do not hold that wait, and the
observation's step is the least of the ranks' steady phase sums (`_phases_step`). A run with
local steps is measured the same way round by round, on rank 0's phases: its local steps' mean
plus one steady round end per H steps (`run_records.steady_step_in_rounds`).

The phases are timed inside the step's graph, so they miss what the training loop does around
them: the step's dispatch, the loop's bookkeeping, a round's end outside its exchange. On a
device under a tight CPU quota that is a tenth of the step and more (LeNet in rounds of 16 on
4 devices at 0.15 cores, 50 ms links: the loop's steady round 3.03 s, its phases 2.67 s).
Newer summaries record the loop's own wall (`step_wall_seconds`; with local steps, each
round's `round_local_seconds` and `round_sync_seconds`), and there the observation's step is
that wall (`run_records.loop_step_seconds`, `step_measured_by`); the older runs keep their phases.

The simulator is checked against the fleet as it ran: every device on one machine (its cores,
less what the link emulation, the launcher and other processes used during the run), and a run
on sites in its sites (each device on its LAN link, each site behind one shared WAN link).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from globaldl.fleet.profiles import LinkProfile
from globaldl.simulate import run_records
from globaldl.summary import steady_phases

DEFAULT_RESULTS_DIR = Path(__file__).resolve().parents[2] / "results" / "experiments"
EXCHANGE_PHASE = "exchange"
# Phases whose work grows with the local batch; compress, decompress and apply depend on the
# model's size only.
BATCH_PHASES = ("data_load", "compute")


@dataclass(frozen=True, eq=False)
class Observation:
    """One fleet run: its configuration and its measured step."""

    experiment: str
    label: str
    model: str
    ranks: int
    profile: LinkProfile
    cpu_cores: tuple[float, ...]
    cycle_time_seconds: float
    combine: str
    payload_bytes: float
    compute_cpu_seconds: tuple[float, ...]  # per rank: CPU of the non-exchange phases per step
    step_seconds: float
    steps: int
    history: tuple[dict[str, Any], ...]
    codec: str
    batch_sizes: tuple[int, ...]
    decompress_seconds: float  # rank 0's wall seconds per step
    compute_wall_seconds: float  # rank 0's non-exchange wall seconds per step
    gradient_bytes_raw_per_step: float
    measured_cpu_seconds_per_step: tuple[float, ...] | None = None
    per_rank_phases: bool = False
    batch_cpu_seconds: float = 0.0  # rank 0's batch-bound share of its compute CPU per step
    repeat: int = 1  # the benchmark protocol's repeat of this run (label) in its experiment
    # The machine every device ran on: its cores less what the links, the launcher and other
    # processes used on average during the run (None where the run recorded no machine).
    host_cores: float | None = None
    # Sites: each rank's site index, and the profile of each device's link to its site's LAN
    # (`profile` is then every site's shared WAN link). None: every device on its own link.
    rank_sites: tuple[int, ...] | None = None
    lan_profile: LinkProfile | None = None
    # Local steps: one exchange every `local_steps` steps (`--sync-every`), behind the next
    # round's compute with `overlap`; the hierarchy the exchange used.
    local_steps: int = 1
    overlap: bool = False
    hierarchy: str = "none"
    # Summed payloads: the collectives one exchange runs one after the other, each on the sum
    # of the one before (PowerSGD: its P factors, then its Q factors); the payload is split
    # evenly between them.
    rounds: int = 1
    # Integer sums (`--quantize intsum`): the lanes' width, which fixes how many ranks they can
    # sum (0: not an integer sum).
    lane_bits: int = 0
    # The machine the run was taken on (`machine_name`: CPU and kernel build, which tells these
    # virtual machines' hosts apart), or "" where none.
    machine: str = ""
    # What `step_seconds` was read from: the loop's own wall ("loop wall", `loop_step_seconds`)
    # or, for runs that did not record it, the sum of the timed phases ("phases").
    step_measured_by: str = "phases"
    # Steps between the run's epoch ends (its steps over its epochs), where the training loop
    # drains an overlapped round in flight; None where that cannot be told (a resumed run).
    epoch_steps: int | None = None

    @property
    def key(self) -> str:
        """`experiment/label`, and the repeat after the first: unique across the results."""
        suffix = f" (repeat {self.repeat})" if self.repeat > 1 else ""
        return f"{self.experiment}/{self.label}{suffix}"

    @property
    def batch_size(self) -> int:
        """Rank 0's local batch."""
        return self.batch_sizes[0]


def _non_exchange(phases: dict[str, float]) -> float:
    return sum(seconds for name, seconds in phases.items() if name != EXCHANGE_PHASE)


def _phases_step(
    phases: dict[str, float],
    steady_steps: int,
    rank_steady: Sequence[tuple[dict[str, float], int]],
) -> float:
    """A run's steady step read from its phases: the least of its ranks' steady phase sums.

    Every rank's step lasts as long as the others' (each waits for the exchange), but a rank
    that waits inside its exchange phase for another rank's work outside the steps counts
    that work in its phases: at an epoch's start the ranks wait for the last one out of the
    epoch's end, once, tens of seconds on 16 devices at 0.125 core. Rank 0's phases carry it
    when rank 0 is not the last; the last rank's do not. The least sum is the rank that
    waited least. `rank_steady`: each rank's steady phases and their steps (`steady_phases`);
    `phases` (rank 0's, over `steady_steps`) where no rank's own are recorded.
    """
    if not rank_steady:
        return sum(phases.values()) / steady_steps
    return min(sum(rank_phases.values()) / rank_steps for rank_phases, rank_steps in rank_steady)


def observation_from_run(experiment: str, run: dict[str, Any]) -> Observation | None:
    """The observation of one run, or None when the run cannot be one (failed, faults)."""
    summary = run.get("summary") or {}
    steps = int(summary.get("steps") or 0)
    phases = summary.get("phase_seconds") or {}
    if run.get("status") != "ok" or run.get("faults") or steps <= 0 or EXCHANGE_PHASE not in phases:
        return None
    ranks = int(summary.get("ranks") or 0)
    link = dict(run.get("link") or {})
    if not link or ranks < 1:
        return None
    profile = LinkProfile.from_config(link)
    if not run.get("latency_emulated", False):
        # The fleet shaped rates only: latency, jitter and loss in the profile never happened.
        profile = profile.rates_only()
    fleet = run.get("spec", {}).get("fleet", {})
    every, overlapped = run_records.local_steps(summary)
    sites, lan = run_records.run_sites(summary, fleet, profile) or (None, None)
    if lan is not None and not run.get("latency_emulated", False):
        lan = lan.rates_only()
    shares = fleet.get("cpu_cores_each") or [fleet.get("cpu_cores_per_device") or 1.0] * ranks
    shares = [float(share) for share in shares[:ranks]]
    compression = summary.get("compression") or {}
    combine, rounds = run_records.payload_collectives(summary, sites)
    batches = [int(size) for size in summary.get("rank_batch_sizes") or []]
    if len(batches) != ranks:
        batches = [int(summary.get("global_batch_size", 0)) // max(ranks, 1)] * ranks
    rank_totals = summary.get("rank_totals") or []
    per_rank = len(rank_totals) == ranks
    # Rank 0's entry holds the summary's phase_seconds; its first step, where recorded.
    phases, steady_steps = steady_phases(
        phases, rank_totals[0].get("first_step_phase_seconds") if per_rank else None, steps
    )
    measured_cpu = None
    # Each rank's own steady phases (its first step left out), and the steps they cover.
    rank_steady = (
        [
            steady_phases(entry["phase_seconds"], entry.get("first_step_phase_seconds"), steps)
            for entry in rank_totals
        ]
        if per_rank
        else []
    )
    if per_rank:
        walls = [_non_exchange(rank_phases) / rank_steps for rank_phases, rank_steps in rank_steady]
        measured_cpu = tuple(float(entry["cpu_seconds"]) / steps for entry in rank_totals)
        compute = [
            step_cpu
            if (step_cpu := run_records.step_cpu_seconds(entry)) is not None
            else min(run_records.burst_cpu_seconds(wall, share), bound)
            for entry, wall, share, bound in zip(
                rank_totals, walls, shares, measured_cpu, strict=True
            )
        ]
    else:
        compute = [
            run_records.burst_cpu_seconds(_non_exchange(phases) / steady_steps, shares[0])
        ] * ranks
    per_epoch = run_records.epoch_steps(summary)
    loop_wall = run_records.loop_step_seconds(summary, every, per_epoch)
    batch_share = sum(phases.get(name, 0.0) for name in BATCH_PHASES) / max(
        _non_exchange(phases), 1e-12
    )
    return Observation(
        experiment=experiment,
        label=str(run.get("spec", {}).get("label") or run.get("run_id")),
        repeat=int(run.get("repeat") or 1),
        model=_model_name(summary),
        ranks=ranks,
        profile=profile,
        cpu_cores=tuple(shares),
        cycle_time_seconds=float(run.get("cycle_time_ms") or 1.0) / 1000,
        combine=combine,
        # One exchange's payload: the run's bytes over its exchanges (steps, or rounds).
        payload_bytes=float(summary["gradient_bytes_wire"])
        / int((summary.get("rounds") or {}).get("rounds") or steps),
        compute_cpu_seconds=tuple(compute),
        step_seconds=(
            loop_wall
            if loop_wall is not None
            else run_records.steady_step_in_rounds(phases, steady_steps, summary["rounds"], every)
            if every > 1
            else _phases_step(phases, steady_steps, rank_steady)
        ),
        step_measured_by="phases" if loop_wall is None else "loop wall",
        epoch_steps=per_epoch,
        steps=steps,
        history=tuple(summary.get("history") or ()),
        codec=run_records.codec_name(compression),
        batch_sizes=tuple(batches),
        decompress_seconds=float(phases.get("decompress", 0.0)) / steady_steps,
        compute_wall_seconds=_non_exchange(phases) / steady_steps,
        gradient_bytes_raw_per_step=float(summary.get("gradient_bytes_raw", 0)) / steps,
        measured_cpu_seconds_per_step=measured_cpu,
        per_rank_phases=measured_cpu is not None,
        batch_cpu_seconds=compute[0] * batch_share,
        host_cores=run_records.host_cores(run),
        local_steps=every,
        overlap=overlapped,
        hierarchy=str((summary.get("exchange") or {}).get("hierarchy") or "none"),
        rounds=rounds,
        lane_bits=int(compression.get("sum_bits") or 0)
        if compression.get("quantize") == "intsum"
        else 0,
        rank_sites=sites,
        lan_profile=lan,
        machine=run_records.machine_name(run),
    )


def cpu_per_example(observations: Iterable[Observation]) -> dict[str, float]:
    """Per model: CPU seconds one more example in the local batch costs (batch-bound phases).

    A least-squares line through every run's rank-0 (batch, batch-bound CPU) where the runs used
    more than one batch; otherwise proportional to the batch (no fixed part).
    """
    points: dict[str, list[tuple[int, float]]] = {}
    for item in observations:
        points.setdefault(item.model, []).append((item.batch_size, item.batch_cpu_seconds))
    slopes = {}
    for model, pairs in points.items():
        batches = np.array([batch for batch, _ in pairs], dtype=float)
        cpu = np.array([seconds for _, seconds in pairs])
        if len(set(batches.tolist())) > 1:
            slopes[model] = max(float(np.polyfit(batches, cpu, 1)[0]), 0.0)
        else:
            slopes[model] = float(np.median(cpu / np.maximum(batches, 1.0)))
    return slopes


def with_batch_scaling(observation: Observation, seconds_per_example: float) -> Observation:
    """The observation with every rank's compute moved by its batch against rank 0's."""
    if observation.per_rank_phases:
        return observation
    base = observation.compute_cpu_seconds[0]
    compute = tuple(
        max(base + seconds_per_example * (batch - observation.batch_sizes[0]), 0.0)
        for batch in observation.batch_sizes
    )
    return replace(observation, compute_cpu_seconds=compute)


def _model_name(summary: dict[str, Any]) -> str:
    model = str(summary.get("model", "?"))
    options = summary.get("model_options") or {}
    if model == "resnet":
        return f"resnet-{options.get('depth', '?')}"
    if model == "mlp":
        return f"mlp-{options.get('layers', '?')}x{options.get('width', '?')}"
    return model


def load_observations(
    results_dir: Path = DEFAULT_RESULTS_DIR, experiments: Iterable[str] | None = None
) -> list[Observation]:
    """Every usable run under `results_dir` (only the named experiments when given)."""
    wanted = set(experiments) if experiments is not None else None
    everything: list[Observation] = []
    for path in sorted(Path(results_dir).glob("*/*.json")):
        document = json.loads(path.read_text())
        if not isinstance(document, dict) or "runs" not in document:
            continue
        # The folder names the experiment: one experiment's plans (rounds and its quick plan,
        # rounds-quick) share run labels but not their lengths, so they stay apart.
        experiment = path.parent.name
        machine = document.get("machine") or {}
        for run in document["runs"]:
            # Runs taken before the runs kept their own machine record share the document's.
            if not run.get("machine") and machine.get("cores"):
                run = run | {"machine": machine}
            observation = observation_from_run(experiment, run)
            if observation is not None:
                everything.append(observation)
    # The cost per example is a property of the model, measured over every run that used it.
    per_example = cpu_per_example(everything)
    return [
        with_batch_scaling(item, per_example[item.model])
        for item in everything
        if wanted is None or item.experiment in wanted
    ]
