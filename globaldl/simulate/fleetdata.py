"""The fleet's committed runs as observations the simulator can be calibrated and checked on.

Every `results/experiments/*/*.json` holds each run's summary (phase times, bytes handed to
Horovod, steps, accuracy history), its link profile, cycle time and byte accounting. A run
becomes an `Observation`: the configuration the simulator needs and the step time it must hit.

Each device's work per step is the CPU time of its non-exchange phases at full core speed (a
CFS quota does not slow a burst down, it stops it when the quota is spent; the simulator
decides when). The summaries hold wall times, so the CPU time is recovered with the quota's
own rule: the phases between two exchanges run as one burst, which starts with a full period's
quota; a burst longer than the quota ran the quota at full speed and the rest at the quota's
rate (`burst_cpu_seconds`). Runs whose summary carries `rank_totals` give every rank's own
phases (and their CPU seconds as a bound); older summaries hold rank 0's only, and the other
ranks' batch-bound phases (input, forward and backward) are moved along each model's measured
cost per example, a line through every run's rank-0 phases at the batches the runs used.

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
the mean over every step. A run with local steps is measured the same way round by round: its
local steps' mean plus one steady round end per H steps (`steady_step_in_rounds`).

The phases are timed inside the step's graph, so they miss what the training loop does around
them: the step's dispatch, the loop's bookkeeping, a round's end outside its exchange. On a
device under a tight CPU quota that is a tenth of the step and more (LeNet in rounds of 16 on
4 devices at 0.15 cores, 50 ms links: the loop's steady round 3.03 s, its phases 2.67 s).
Newer summaries record the loop's own wall (`step_wall_seconds`; with local steps, each
round's `round_local_seconds` and `round_sync_seconds`), and there the observation's step is
that wall (`loop_step_seconds`, `step_measured_by`); the older runs keep their phases.

The simulator is checked against the fleet as it ran: every device on one machine (its cores,
less what the link emulation, the launcher and other processes used during the run), and a run
on sites in its sites (each device on its LAN link, each site behind one shared WAN link).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from globaldl.fleet.profiles import LinkProfile, load_profiles
from globaldl.fleet.sites import DEFAULT_LAN_PROFILE, parse_sites
from globaldl.hierarchy import Hierarchy
from globaldl.simulate.cpu import CFS_PERIOD_SECONDS
from globaldl.summary import steady_phases

DEFAULT_RESULTS_DIR = Path(__file__).resolve().parents[2] / "results" / "experiments"
EXCHANGE_PHASE = "exchange"
# Phases whose work grows with the local batch; compress, decompress and apply depend on the
# model's size only.
BATCH_PHASES = ("data_load", "compute")
# Before summaries recorded the codec's wire declaration (`exchange`), only these summed: no
# pruning and one of these quantizers; every other codec was gathered.
SUMMABLE_QUANTIZERS = ("none", "fp16")


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


def _step_cpu_seconds(rank_total: dict[str, Any]) -> float | None:
    """A rank's measured process CPU per training step, or None where not recorded."""
    steps = int(rank_total.get("step_cpu_steps") or 0)
    if steps < 1:
        return None
    return float(rank_total["step_cpu_seconds"]) / steps


def burst_cpu_seconds(wall_seconds: float, cores: float) -> float:
    """CPU seconds of a burst that took `wall_seconds` under a quota of `cores`.

    The burst starts with a full period's quota (the device waited for the network before):
    up to that quota it runs at full speed, beyond it at the quota's rate.
    """
    quota = cores * CFS_PERIOD_SECONDS
    if cores >= 1.0 or wall_seconds <= quota:
        return wall_seconds
    return quota + cores * (wall_seconds - quota)


def host_cores(run: dict[str, Any]) -> float | None:
    """Cores the devices of a run had between them: the machine's, less its other load.

    The load record (`load`) holds the CPU seconds of the link emulation, of the launcher
    (horovodrun, ssh) and of processes outside the fleet over the run; their mean is taken
    off the machine's cores. None when the run recorded no machine.
    """
    cores = (run.get("machine") or {}).get("cores")
    if not cores:
        return None
    load = run.get("load") or {}
    seconds = float(load.get("seconds") or 0.0)
    other = sum(
        float(load.get(name) or 0.0)
        for name in ("emulation_cpu_seconds", "driver_cpu_seconds", "outside_cpu_seconds")
    )
    busy = other / seconds if seconds > 0 else 0.0
    # A tenth of the machine at least: a load record cannot leave the devices nothing.
    return max(float(cores) - busy, 0.1 * float(cores))


def machine_name(run: dict[str, Any]) -> str:
    """The run's machine as `cpu kernel`, or "" when it recorded none.

    Not the CPU's signature: only the later runs record it, and one host must keep one name
    across them (the runs of one host were two machines to the ranking check while it did).
    """
    machine = run.get("machine") or {}
    keys = ("cpu", "kernel")
    return " ".join(str(machine[key]) for key in keys if machine.get(key))


def run_sites(
    summary: dict[str, Any], fleet: dict[str, Any], wan: LinkProfile
) -> tuple[tuple[int, ...], LinkProfile] | None:
    """Each rank's site and the sites' LAN profile, for a run on a `--sites SxM` grid.

    None without sites. `wan` is the run's recorded link (every site's shared one). The layouts
    are `fleet up`'s own (`parse_sites`), whose devices fill the sites in order (site 1:
    devices 1..M); the summary lists the device of every rank (`devices`, names ending in the
    device number).
    """
    grid = str(fleet.get("sites") or "")
    if not grid:
        return None
    count, _, per_site = grid.partition("x")
    if not (count.isdigit() and per_site.isdigit()):
        raise ValueError(f"run on sites {grid!r}: only an SxM grid can be simulated")
    profiles = load_profiles() | {wan.name: wan}
    layouts = parse_sites(grid, profiles, fleet.get("lan") or DEFAULT_LAN_PROFILE, wan.name)
    site_of_device = [index for index, layout in enumerate(layouts) for _ in range(layout.devices)]
    names = summary.get("devices") or []
    if len(names) != int(summary.get("ranks") or 0):
        raise ValueError(f"run on sites {grid!r}: its summary lists no device per rank")
    ranks = tuple(site_of_device[int(name.rsplit("-", 1)[-1]) - 1] for name in names)
    return ranks, layouts[0].lan


def local_steps(summary: dict[str, Any]) -> tuple[int, bool]:
    """(steps per exchange, overlapped) of a run: (1, False) without local steps.

    `--sync-every H` gives H; a wall-clock budget (`2s`) the run's mean steps per round.
    """
    rounds = summary.get("rounds") or {}
    if not rounds:
        return 1, False
    every = str(rounds.get("sync_every") or "1")
    if every.isdigit():
        steps = int(every)
    else:
        steps = round(int(summary.get("steps") or 0) / max(int(rounds.get("rounds") or 1), 1))
    return max(steps, 1), bool(rounds.get("overlap"))


def steady_step_in_rounds(
    phases: dict[str, float], steady_steps: int, rounds: dict[str, Any], every: int
) -> float:
    """Rank 0's steady step of a run with local steps: local step plus a round end per H steps.

    The mean local step, plus one steady round end spread over the `every` steps of a round.
    `phases` are the run's steady steps' (its first step, a local one, left out) with every
    round end's time inside; `rounds` is the summary's section. The simulator predicts one
    exchange every `every` steps, each one steady; the run's mean step is not that: its last
    round is cut short when training ends (40 steps in rounds of 16 end three rounds, not 2.5),
    and its first round end meets Horovod's first negotiation of the exchange's tensors. So the
    round ends' mean is taken without the first where the summary records it
    (`first_round_sync_seconds`, two rounds or more), over every round otherwise.
    """
    total = sum(phases.values())
    count = int(rounds.get("rounds") or 0)
    sync = rounds.get("sync_seconds")
    if count < 1 or sync is None:
        return total / steady_steps
    sync = min(float(sync), total)
    first = rounds.get("first_round_sync_seconds")
    if first is not None and count >= 2:
        per_round = max(sync - float(first), 0.0) / (count - 1)
    else:
        per_round = sync / count
    return (total - sync) / steady_steps + per_round / every


def epoch_steps(summary: dict[str, Any]) -> int | None:
    """Steps between a run's epoch ends (its steps over its epochs; at least 1).

    None for a resumed run: its records start at the resumed epoch, so where its epochs ended
    among them cannot be told.
    """
    if summary.get("resumed_from_epoch"):
        return None
    return max(int(summary.get("steps") or 0) // max(int(summary.get("epochs") or 1), 1), 1)


def loop_step_seconds(summary: dict[str, Any], every: int, per_epoch: int | None) -> float | None:
    """The training loop's steady wall seconds a step, where the summary records them.

    What the phases leave out is in it: the step's dispatch, the loop's bookkeeping between
    steps and at a round's end (on a device under a CPU quota, a tenth of the round and more).
    With local steps it is the mean of the steady rounds' own seconds (`round_local_seconds`
    plus `round_sync_seconds`) over their `every` steps: the first round (the traced first step,
    Horovod's first negotiation) and every round across an epoch's end (validation, the next
    epoch's input pipeline) left out. Per step, the loop's wall from each step's start to the
    next one's (`step_wall_seconds`). `per_epoch`: the run's `epoch_steps`. None where the
    summary records neither (older runs).
    """
    rounds = summary.get("rounds") or {}
    local, sync = rounds.get("round_local_seconds"), rounds.get("round_sync_seconds")
    if every > 1:
        # Rounds by wall-clock time do not say which of them an epoch's end fell in, nor do
        # the rounds of a resumed run (`per_epoch` None).
        by_steps = str(rounds.get("sync_every", "")).isdigit()
        if not by_steps or per_epoch is None or not local or not sync or len(local) != len(sync):
            return None
        steps = int(summary.get("steps") or 0)
        # A last round cut short by the run's end has fewer steps: left out too.
        whole = min(len(local), steps // every)
        steady = [
            local[index] + sync[index]
            for index in range(1, whole)
            if (index * every) // per_epoch == ((index + 1) * every - 1) // per_epoch
        ]
        return float(np.mean(steady)) / every if steady else None
    steps = int(summary.get("step_wall_steps") or 0)
    return float(summary["step_wall_seconds"]) / steps if steps > 0 else None


def _codec(compression: dict[str, Any]) -> str:
    """A run's codec as its flags name it: `topk0.01+int8`, `powersgd-r2+fp16`, `fp16`."""
    prune = compression.get("prune", "none")
    quantize = compression.get("quantize", "none")
    if prune == "none":
        return quantize
    if prune == "powersgd":
        pruned = f"powersgd-r{compression.get('powersgd_rank')}"
    else:
        pruned = f"{prune}{compression.get('density'):g}"
    return f"{pruned}+{quantize}" if quantize != "none" else pruned


def payload_collectives(
    summary: dict[str, Any], rank_sites: tuple[int, ...] | None = None
) -> tuple[str, int]:
    """(how payloads combine, summed collectives per exchange) as the run's codec declared.

    Summaries record the codec's wire declaration (`exchange`: `combine`, and
    `collectives_per_step`: rank 0's, a site leader's with sites (`rank_sites`), which runs
    `Hierarchy.collectives_per_round` per payload round); the newest record the
    declaration itself (`exchange.wire.round_bytes`, one entry per round). Older ones
    record none, and their codecs summed only without pruning and with a float quantizer.
    A gathered exchange is one allgather here: a varying length's own small allgather first
    (DGC, threshold) is not simulated.
    """
    declared = summary.get("exchange") or {}
    combine = declared.get("combine")
    if combine is None:
        compression = summary.get("compression") or {}
        summable = (
            compression.get("prune", "none") == "none"
            and compression.get("quantize", "none") in SUMMABLE_QUANTIZERS
        )
        return ("sum" if summable else "gather"), 1
    if combine != "sum":
        return str(combine), 1
    wire = declared.get("wire") or {}
    if wire.get("round_bytes"):
        return "sum", len(wire["round_bytes"])
    collectives = int(declared.get("collectives_per_step") or 1)
    if declared.get("hierarchy", "none") != "none" and rank_sites:
        site_of_rank = [str(site) for site in rank_sites]
        collectives //= Hierarchy.from_site_names(site_of_rank, rank=0).collectives_per_round
    return "sum", max(collectives, 1)


def _non_exchange(phases: dict[str, float]) -> float:
    return sum(seconds for name, seconds in phases.items() if name != EXCHANGE_PHASE)


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
    every, overlapped = local_steps(summary)
    sites, lan = run_sites(summary, fleet, profile) or (None, None)
    if lan is not None and not run.get("latency_emulated", False):
        lan = lan.rates_only()
    shares = fleet.get("cpu_cores_each") or [fleet.get("cpu_cores_per_device") or 1.0] * ranks
    shares = [float(share) for share in shares[:ranks]]
    compression = summary.get("compression") or {}
    combine, rounds = payload_collectives(summary, sites)
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
    if per_rank:
        walls = [
            _non_exchange(rank_phases) / rank_steps
            for rank_phases, rank_steps in (
                steady_phases(entry["phase_seconds"], entry.get("first_step_phase_seconds"), steps)
                for entry in rank_totals
            )
        ]
        measured_cpu = tuple(float(entry["cpu_seconds"]) / steps for entry in rank_totals)
        compute = [
            step_cpu
            if (step_cpu := _step_cpu_seconds(entry)) is not None
            else min(burst_cpu_seconds(wall, share), bound)
            for entry, wall, share, bound in zip(
                rank_totals, walls, shares, measured_cpu, strict=True
            )
        ]
    else:
        compute = [burst_cpu_seconds(_non_exchange(phases) / steady_steps, shares[0])] * ranks
    per_epoch = epoch_steps(summary)
    loop_wall = loop_step_seconds(summary, every, per_epoch)
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
            else steady_step_in_rounds(phases, steady_steps, summary["rounds"], every)
            if every > 1
            else sum(phases.values()) / steady_steps
        ),
        step_measured_by="phases" if loop_wall is None else "loop wall",
        epoch_steps=per_epoch,
        steps=steps,
        history=tuple(summary.get("history") or ()),
        codec=_codec(compression),
        batch_sizes=tuple(batches),
        decompress_seconds=float(phases.get("decompress", 0.0)) / steady_steps,
        compute_wall_seconds=_non_exchange(phases) / steady_steps,
        gradient_bytes_raw_per_step=float(summary.get("gradient_bytes_raw", 0)) / steps,
        measured_cpu_seconds_per_step=measured_cpu,
        per_rank_phases=measured_cpu is not None,
        batch_cpu_seconds=compute[0] * batch_share,
        host_cores=host_cores(run),
        local_steps=every,
        overlap=overlapped,
        hierarchy=str((summary.get("exchange") or {}).get("hierarchy") or "none"),
        rounds=rounds,
        lane_bits=int(compression.get("sum_bits") or 0)
        if compression.get("quantize") == "intsum"
        else 0,
        rank_sites=sites,
        lan_profile=lan,
        machine=machine_name(run),
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
