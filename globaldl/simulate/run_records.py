"""What one committed fleet run's records say, read for the simulator.

A run's summary and its row in the experiment's results (machine, load, fleet) give: its
devices' share of the host (`host_cores`), the host's name (`machine_name`), its sites
(`run_sites`), its local steps (`local_steps`), steady step in rounds and epochs
(`steady_step_in_rounds`, `epoch_steps`), the training loop's own wall a step
(`loop_step_seconds`), its CPU per step (`step_cpu_seconds`, or the CFS burst rule of
`burst_cpu_seconds`) and its exchange (`codec_name`, `payload_collectives`).
`fleetdata` makes an `Observation` of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from globaldl.fleet.profiles import LinkProfile, load_profiles
from globaldl.fleet.sites import DEFAULT_LAN_PROFILE, parse_sites
from globaldl.hierarchy import Hierarchy
from globaldl.simulate.cpu import CFS_PERIOD_SECONDS

# Before summaries recorded the codec's wire declaration (`exchange`), only these summed: no
# pruning and one of these quantizers; every other codec was gathered.
SUMMABLE_QUANTIZERS = ("none", "fp16")


def step_cpu_seconds(rank_total: dict[str, Any]) -> float | None:
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
    plus `round_sync_seconds`) over their `every` steps, the rounds `steady_round_indices`
    keeps: not the first, nor one an epoch's end (validation, the next epoch's input pipeline)
    touches. Per step, the loop's wall from each step's start to the next one's
    (`step_wall_seconds`). `per_epoch`: the run's `epoch_steps`. None where the summary
    records neither (older runs).
    """
    rounds = summary.get("rounds") or {}
    local, sync = rounds.get("round_local_seconds"), rounds.get("round_sync_seconds")
    if every > 1:
        # Rounds by wall-clock time do not say which of them an epoch's end fell in, nor do
        # the rounds of a resumed run (`per_epoch` None).
        by_steps = str(rounds.get("sync_every", "")).isdigit()
        if not by_steps or per_epoch is None or not local or not sync or len(local) != len(sync):
            return None
        walls = [own + wait for own, wait in zip(local, sync, strict=True)]
        return steady_step_seconds(
            walls, every, per_epoch, int(summary.get("steps") or 0), bool(rounds.get("overlap"))
        )
    steps = int(summary.get("step_wall_steps") or 0)
    return float(summary["step_wall_seconds"]) / steps if steps > 0 else None


def steady_step_seconds(
    round_walls: Sequence[float], every: int, per_epoch: int, steps: int, overlap: bool = False
) -> float | None:
    """The steady rounds' mean wall over their `every` steps (`steady_round_indices`).

    `round_walls` are a run's rounds in order, measured or simulated; None when no round is
    steady.
    """
    indices = steady_round_indices(len(round_walls), every, per_epoch, steps, overlap)
    return float(np.mean([round_walls[index] for index in indices])) / every if indices else None


def steady_round_indices(
    rounds: int, every: int, per_epoch: int, steps: int, overlap: bool = False
) -> list[int]:
    """The rounds a run's steady round is read from, of its first `rounds` rounds of `every` steps.

    Left out: the first round (the traced first step, Horovod's first negotiation), a last
    round cut short by the run's `steps`, and every round an epoch's end touches: one it falls
    inside, one it ends with (rounds-host's first H = 4 run: such a round's exchange waited
    15 s where the others' took 1.8 s) and one that starts right after it (the epoch's end, its
    validation and a drained round in flight, is timed in that round's local steps:
    `RoundEngine.end_round` starts the next round's clock before the loop ends the epoch). The
    simulator's rounds of a run are read by the same rule (`calibration.as_measured`), so both
    sides average the same rounds.

    With `overlap` a round's wall holds the wait for the round before's exchange, so the round
    before must be steady too: round 1 waits for the first round's exchange, Horovod's first
    negotiation (rounds-host's dense H = 16 runs: 3.8-4.8 s where the others take 2.8 s), and the
    round after one an epoch ends inside waits for an exchange handed over after validation
    (rounds-host's overlapped H = 4 and 16 runs: 0.14-0.19 s longer, per run).

    >>> steady_round_indices(10, 4, 12, 40)  # epochs end after steps 12, 24 and 36
    [1, 4, 7]
    >>> steady_round_indices(10, 4, 100, 40, overlap=True)
    [2, 3, 4, 5, 6, 7, 8, 9]
    """
    whole = min(rounds, steps // every)
    clean = [
        index
        for index in range(1, whole)
        # No epoch end among steps first..last, nor right before the first one.
        if (index * every - 1) // per_epoch == ((index + 1) * every) // per_epoch
    ]
    if overlap:
        kept = set(clean)
        return [index for index in clean if index - 1 in kept]
    return clean


def codec_name(compression: dict[str, Any]) -> str:
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
