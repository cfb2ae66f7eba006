"""The markdown sections every experiment's report shares: targets, protocol and load, links."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from globaldl.experiments.aggregate import MIN_REPEATS
from globaldl.experiments.analysis import TargetCheck
from globaldl.experiments.results import RunResult
from globaldl.fleet.cycle_time import (
    COORDINATION_BYTES_PER_CYCLE,
    CYCLE_TIME_LADDER_MS,
    HOROVOD_DEFAULT_CYCLE_TIME_MS,
    MAX_COORDINATION_SHARE,
    measured_coordination_text,
)

if TYPE_CHECKING:
    from globaldl.experiments.runner import ExperimentRunner


LOAD_COLUMNS = (
    "label",
    "repeat",
    "status",
    "outside_cpu_cores",
    "outside_cpu_cores_peak",
    "emulation_cpu_cores",
    "driver_cpu_cores",
    "load_average_1m_max",
    "machine_busy",
)


def load_columns(result: RunResult) -> dict[str, Any]:
    """The machine's load during the run, in cores (CPU seconds per second of the run)."""
    load = result.load
    if load is None:
        return {"machine_busy": None}

    def cores(cpu_seconds: float | None) -> float | None:
        return None if cpu_seconds is None or load.seconds <= 0 else cpu_seconds / load.seconds

    return {
        "outside_cpu_cores": load.outside_cores_mean,
        "outside_cpu_cores_peak": load.outside_cores_peak,
        "emulation_cpu_cores": cores(load.emulation_cpu_seconds),
        "devices_cpu_cores": cores(load.devices_cpu_seconds),
        "driver_cpu_cores": cores(load.driver_cpu_seconds),
        "load_average_1m_max": load.load_average_1m_max,
        "machine_busy": load.busy,
        "reruns": result.reruns,
    }


def link_notes(results: Sequence[RunResult]) -> str:
    """What the fleet emulated and what it did not (latency), and the cycle times used."""
    emulated = {result.latency_emulated for result in results}
    delayed = any(result.link.impaired for result in results)
    if not delayed:
        latency = "The links shape rates only (tc tbf, layer-2 bytes); no profile adds delay."
    elif emulated == {True}:
        latency = (
            "Delay, jitter and loss of the profiles were emulated in user space (vde2 wirefilter "
            "between switches; globaldl/fleet/vde.py), rates shaped with tc tbf; the forwarding "
            "processes ran in the fleet's `emulation` cgroup, outside the devices' CPU quotas."
        )
    else:
        latency = (
            "**Delay is NOT emulated in every run**: where the fleet could not emulate links "
            "(column `latency_emulated` false) it shaped RATES only (tc tbf, layer-2 bytes). "
            "Profiles keep their names, but no one-way delay, jitter or loss was added there; "
            "results from before the links carried delay (vde2) are of that kind."
        )
    cycles = sorted({result.cycle_time_ms for result in results})
    cycle_text = ", ".join(f"{value:g} ms" for value in cycles) or "none"
    return (
        f"{latency}\n\n"
        f"HOROVOD_CYCLE_TIME used: {cycle_text} (column `horovod_cycle_time_ms`). Horovod's "
        f"default is {HOROVOD_DEFAULT_CYCLE_TIME_MS:g} ms, and its coordination runs every "
        f"cycle even when idle. {measured_coordination_text()} A longer cycle delays every "
        "collective instead. Unless a run says otherwise, the cycle time is chosen per link: "
        f"the shortest of {', '.join(f'{value:g}' for value in CYCLE_TIME_LADDER_MS)} ms that "
        f"keeps idle coordination ({COORDINATION_BYTES_PER_CYCLE} bytes per device per cycle) "
        f"under {MAX_COORDINATION_SHARE:.0%} of the narrower direction "
        "(globaldl/fleet/cycle_time.py).\n\n"
        "What the byte columns mean: `wire_bytes_per_step` is what one rank handed to Horovod "
        "per step (payload); `compression_ratio` is dense fp32 bytes over that (a payload "
        "ratio). `device_tx_bytes_per_step_model` is what a device sends per step for the "
        "gradients by the collective's algorithm (ring allgather: N-1 times the payload, ring "
        "allreduce: 2(N-1)/N), `traffic_ratio_vs_dense_model` the dense fp32 ring allreduce's "
        "bytes over that. `device_tx_bytes_per_step` is what a device's interface really sent "
        "per step over the whole run (mean over devices: gradients, broadcast, coordination, "
        "headers, logs), and `traffic_ratio_vs_dense_measured` the uncompressed run's figure "
        "over this run's, on the same fleet: the per-device traffic ratio against dense "
        "Horovod. `coordination_payload_bytes_per_second` is the TCP payload per second of "
        "Horovod's life that each device sent beyond its gradients, other collectives and log "
        "lines (fleet byte accounting; headers excluded)."
    )


def targets_markdown(checks: Sequence[TargetCheck]) -> str:
    """The targets table: goal, met / NOT met / not evaluated, what was measured."""
    from globaldl.markdown import markdown_table

    if not checks:
        return ""
    return "## Targets (reported, never asserted)\n\n" + markdown_table(
        [check.as_row() for check in checks], ["goal", "status", "measured"]
    )


def protocol_record(runner: ExperimentRunner, repeats: int) -> dict[str, Any]:
    """How the runs were taken: repeats, their order, and what was done on a busy machine."""
    return {
        "repeats": repeats,
        "order": "interleaved: repeat 1 of every run, then repeat 2, ...",
        "busy_policy": runner.busy_policy,
        "max_reruns": runner.max_reruns,
        "busy_limits": runner.busy_limits.get_config(),
    }


def protocol_markdown(results: Sequence[RunResult], protocol: dict[str, Any] | None) -> str:
    """The protocol section: what a median rests on, and which runs saw a busy machine."""
    repeats = (protocol or {}).get("repeats") or max((r.repeat for r in results), default=1)
    if repeats > 1:
        order = f"Each run was repeated {repeats} times, interleaved (repeat 1 of every run, then "
        order += "repeat 2, ...). "
    else:
        order = "Each run ran once. "
    lines = [
        order + "Table cells are the median over the finished repeats, with `[min-max]` where "
        "they differ (`repeats`: how many finished; `busy_repeats`: how many of them the "
        "machine was busy for, blank when not recorded); the targets are evaluated on the "
        "medians."
    ]
    if repeats < MIN_REPEATS:
        lines.append(
            f"**Fewer than {MIN_REPEATS} repeats: these numbers show that the experiment runs, "
            "they are not benchmark results.**"
        )
    if protocol and "busy_limits" in protocol:
        limits = protocol["busy_limits"]
        lines.append(
            "The machine's load was recorded during every run (globaldl/experiments/load.py). A "
            "run counts as taken on a busy machine when processes outside the fleet (and "
            "outside the experiment's own `fleet run`, horovodrun and ssh) used more than "
            f"{limits['outside_cores_mean']:g} cores on average, or more than "
            f"{limits['outside_cores_peak']:g} cores over any {limits['peak_window_seconds']:g} "
            f"s; busy runs were handled by policy `{protocol['busy_policy']}` (mark: kept and "
            "counted in `busy_repeats`; refuse: left out of the medians; rerun: run again on a "
            "quiet machine)."
        )
    unrecorded = sum(1 for result in results if result.load is None)
    if unrecorded:
        lines.append(
            f"**{unrecorded} of {len(results)} runs carry no load record** (taken before the "
            "protocol recorded it): whether the machine was busy during them is not known."
        )
    busy = [result for result in results if result.machine_busy]
    if busy:
        lines.append(
            "Taken on a busy machine: "
            + ", ".join(f"{result.spec.label} repeat {result.repeat}" for result in busy)
            + "."
        )
    return "## Protocol and machine load\n\n" + "\n\n".join(lines)


def load_markdown(run_rows: Sequence[dict[str, Any]]) -> str:
    """The machine's load during each run that recorded it (empty when none did)."""
    from globaldl.markdown import markdown_table

    recorded = [row for row in run_rows if row.get("machine_busy") is not None]
    if not recorded:
        return ""
    return (
        "### Load during each run (cores: CPU seconds per second of the run)\n\n"
        + markdown_table(recorded, [c for c in LOAD_COLUMNS if any(c in r for r in recorded)])
    )
