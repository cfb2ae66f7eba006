"""A run report for people without Grafana: markdown and PNG plots, from Prometheus or a summary."""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

# Figures are made with matplotlib's object API and rendered by Agg into PNG bytes: no pyplot,
# no global figure state, no window.
from matplotlib.figure import Figure

from globaldl.files import write_bytes_atomically, write_text_atomically
from globaldl.monitoring.metrics import check_run_id
from globaldl.monitoring.phases import (
    PHASES,
    bottleneck_phase,
    check_phase_seconds,
    own_seconds_per_step,
)
from globaldl.monitoring.promql import PrometheusApi, Series

DEFAULT_LOOKBACK_SECONDS = 24 * 3600.0
"""How far back `load_from_prometheus` looks for the run."""
RANGE_POINTS = 200
"""About this many points per plotted time series."""
MIN_RATE_WINDOW_SECONDS = 20.0
"""The shortest rate() window of the plotted rates: several scrapes at a 5 s interval."""

_NOT_EXCHANGE = 'phase!="exchange"'
PHASE_COLOURS = dict(zip(PHASES, matplotlib.colormaps["tab10"].colors, strict=False))


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


# ------------------------------------------------------------------------------------ sources
def load_from_summary(path: Path) -> RunData:
    """A report's data from a run summary (rank 0's view; no time series, no resources)."""
    from globaldl import summary as run_summary

    document = run_summary.read(Path(path))
    ranks = max(int(document["ranks"]), 1)
    device = (document.get("devices") or ["rank 0"])[0]
    own_totals = (document.get("rank_totals") or [{}])[0]
    first_step = own_totals.get("first_step_phase_seconds")
    rank0 = RankTotals(
        rank=0,
        device=device,
        steps=float(document["steps"]),
        skipped_steps=float(document.get("skipped_steps", 0)),
        examples=float(document["steps"]) * document["global_batch_size"] / ranks,
        phase_seconds=check_phase_seconds(document["phase_seconds"]),
        gradient_bytes_raw=float(document["gradient_bytes_raw"]),
        gradient_bytes_wire=float(document["gradient_bytes_wire"]),
        first_step_phase_seconds=check_phase_seconds(first_step) if first_step else None,
    )
    epochs = [
        EpochPoint(
            int(entry["epoch"]),
            float(entry["loss"]),
            float(entry["val_loss"]),
            float(entry["val_accuracy"]),
            float(entry.get("examples_per_second", math.nan)),
        )
        for entry in document.get("history", [])
    ]
    source = (
        f"run summary {path} (rank 0 of {ranks}; {document['model']} on {document['dataset']}, "
        f"{document['wall_seconds']:.1f} s; with one rank, its exchange includes any waiting "
        "for peers)"
    )
    return RunData(document["run_id"], source, [rank0], epochs)


def _by_labels(samples: list[Any], *names: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sample.labels.get(name, "") for name in names): sample.value for sample in samples
    }


def _run_time_range(api: PrometheusApi, run: str, lookback_seconds: float) -> tuple[float, float]:
    """(first worker start, latest step) of `run` as Unix seconds, from raw samples."""
    selector = f'{{run="{run}"}}'
    lookback = f"{int(lookback_seconds)}s"
    starts = api.query(f"min(min_over_time(globaldl_run_start_time_seconds{selector}[{lookback}]))")
    ends = api.query(
        f"max(max_over_time(globaldl_last_step_timestamp_seconds{selector}[{lookback}]))"
    )
    if not starts or not ends or not all(math.isfinite(s.value) for s in starts + ends):
        seen = api.query(f"count by (run) (last_over_time(globaldl_steps_total[{lookback}]))")
        runs = sorted(sample.labels.get("run", "") for sample in seen)
        raise ValueError(
            f"Prometheus at {api.url} has no steps of run {run!r} in the last {lookback}; "
            f"runs it has: {', '.join(runs) or 'none'}"
        )
    return starts[0].value, max(ends[0].value, starts[0].value + 1.0)


def load_from_prometheus(
    api: PrometheusApi, run: str, *, lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS
) -> RunData:
    """A report's data for `run` from Prometheus: per-rank totals and each view's time series."""
    check_run_id(run)
    start, end = _run_time_range(api, run, lookback_seconds)
    selector = f'{{run="{run}"}}'
    # Every total is read at one instant, so steps and seconds come from the same scrapes: a
    # second past the latest sample of a live run, or a minute after a finished run's last
    # step (its final scrapes).
    evaluated_at = min(time.time() - 1.0, end + 60.0)
    whole_run = f"{int(evaluated_at - start) + 60}s"

    def last(metric: str, *names: str) -> dict[tuple[str, ...], float]:
        expr = f"last_over_time({metric}{selector}[{whole_run}])"
        return _by_labels(api.query(expr, time_seconds=evaluated_at), *names)

    phase_seconds = last("globaldl_step_phase_seconds_sum", "device", "rank", "phase")
    first_step = last("globaldl_first_step_phase_seconds", "device", "rank", "phase")
    steps = last("globaldl_steps_total", "device", "rank")
    skipped = last("globaldl_skipped_steps_total", "device", "rank")
    examples = last("globaldl_examples_total", "device", "rank")
    gradient_bytes = last("globaldl_gradient_bytes_total", "device", "rank", "kind")
    ranks = [
        RankTotals(
            rank=int(rank),
            device=device,
            steps=count,
            skipped_steps=skipped.get((device, rank), 0.0),
            examples=examples.get((device, rank), 0.0),
            phase_seconds={
                phase: phase_seconds.get((device, rank, phase), 0.0) for phase in PHASES
            },
            gradient_bytes_raw=gradient_bytes.get((device, rank, "raw"), 0.0),
            gradient_bytes_wire=gradient_bytes.get((device, rank, "wire"), 0.0),
            first_step_phase_seconds=(
                {phase: first_step.get((device, rank, phase), 0.0) for phase in PHASES}
                if any(key[:2] == (device, rank) for key in first_step)
                else None
            ),
        )
        for (device, rank), count in sorted(steps.items(), key=lambda item: int(item[0][1]))
    ]
    step_seconds = max((end - start) / RANGE_POINTS, 1.0)
    window = f"{int(max(2 * step_seconds, MIN_RATE_WINDOW_SECONDS))}s"

    def rate(metric: str, extra: str = "") -> str:
        matchers = f'run="{run}"' + (f", {extra}" if extra else "")
        return f"rate({metric}{{{matchers}}}[{window}])"

    queries = {
        "phase_seconds_per_step": (
            f"sum by (device, phase) ({rate('globaldl_step_phase_seconds_sum')})"
            f" / on (device) group_left () sum by (device) ({rate('globaldl_steps_total')})"
        ),
        "throughput": f"sum by (device) ({rate('globaldl_examples_total')})",
        "loss": f"globaldl_loss{selector}",
        "val_accuracy": f"max by (device) (globaldl_validation_accuracy_ratio{selector})",
        "cpu": f"max by (device) (globaldl_device_cpu_utilization_ratio{selector})",
        "memory": f"max by (device) (globaldl_device_memory_used_bytes{selector})",
        "network_transmit": (
            f"max by (device) ({rate('globaldl_device_network_transmit_bytes_total')})"
        ),
        "network_receive": (
            f"max by (device) ({rate('globaldl_device_network_receive_bytes_total')})"
        ),
        "disk_read": f"max by (device) ({rate('globaldl_device_disk_read_bytes_total')})",
        "local_step_seconds": (
            f"sum by (device, rank) ({rate('globaldl_step_phase_seconds_sum', _NOT_EXCHANGE)})"
            f" / sum by (device, rank) ({rate('globaldl_steps_total')})"
        ),
    }
    series = {
        name: api.query_range(expr, start, end, step_seconds) for name, expr in queries.items()
    }
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(start))
    source = f"Prometheus at {api.url}, {started} UTC + {end - start:.0f} s"
    return RunData(run, source, ranks, [], series)


# -------------------------------------------------------------------------------------- plots
def _figure(rows: int = 1, columns: int = 1, height: float = 3.6) -> tuple[Figure, Any]:
    figure = Figure(figsize=(9, height * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    return figure, axes


def _series_label(series: Series, *names: str) -> str:
    return " ".join(
        (f"rank {series.labels[name]}" if name == "rank" else series.labels[name])
        for name in names
        if name in series.labels
    )


def plot_step_time_by_phase(run: RunData) -> Figure | None:
    """Stacked bars per device: own ms per step in each phase, then waiting for peers."""
    profiles = device_profiles(run)
    if not profiles:
        return None
    figure, axes = _figure(height=1.2 + 0.7 * len(profiles))
    axis = axes[0][0]
    for row, profile in enumerate(profiles):
        left = 0.0
        for phase, seconds in profile.own_seconds.items():
            axis.barh(
                row,
                1000 * seconds,
                left=left,
                color=PHASE_COLOURS[phase],
                label=phase if row == 0 else None,
            )
            left += 1000 * seconds
        axis.barh(
            row,
            1000 * profile.peer_wait_seconds,
            left=left,
            color="lightgrey",
            hatch="//",
            label="waiting for peers" if row == 0 else None,
        )
        left += 1000 * profile.peer_wait_seconds
        bottleneck = profile.bottleneck()
        if bottleneck is not None:
            axis.text(left, row, f"  {bottleneck.phase} {bottleneck.share:.0%}", va="center")
    axis.set_yticks(range(len(profiles)), [profile.device for profile in profiles])
    axis.invert_yaxis()
    axis.set_xlabel("ms per step (mean over the ranks of the device)")
    axis.set_title("Step time by phase per device (label: the bottleneck, share of own time)")
    axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    axis.margins(x=0.2)
    return figure


def plot_step_time_over_time(run: RunData) -> Figure | None:
    """Per device: seconds per step by phase over the run, stacked."""
    by_device: dict[str, list[Series]] = {}
    for series in run.series.get("phase_seconds_per_step", []):
        by_device.setdefault(series.labels.get("device", ""), []).append(series)
    if not by_device:
        return None
    figure, axes = _figure(len(by_device))
    for axis, (device, group) in zip(axes[:, 0], sorted(by_device.items()), strict=True):
        group.sort(
            key=lambda s: PHASES.index(s.labels["phase"]) if s.labels.get("phase") in PHASES else 99
        )
        times = group[0].times_seconds
        aligned = [s for s in group if s.times_seconds == times]
        start = times[0]
        axis.stackplot(
            [t - start for t in times],
            [[1000 * v if math.isfinite(v) else 0.0 for v in s.values] for s in aligned],
            labels=[s.labels.get("phase", "") for s in aligned],
            colors=[PHASE_COLOURS.get(s.labels.get("phase", ""), "grey") for s in aligned],
        )
        axis.set_title(f"{device}: ms per step by phase")
        axis.set_ylabel("ms per step")
        axis.legend(fontsize=7, loc="upper left", ncols=3)
    axes[-1][0].set_xlabel("seconds since the run's first sample")
    return figure


def plot_gradient_bytes(run: RunData) -> Figure | None:
    """Raw vs wire gradient bytes per device, with the compression ratio."""
    devices = run.devices()
    raw = [sum(r.gradient_bytes_raw for r in run.ranks if r.device == d) for d in devices]
    wire = [sum(r.gradient_bytes_wire for r in run.ranks if r.device == d) for d in devices]
    if not any(raw) and not any(wire):
        return None
    figure, axes = _figure()
    axis = axes[0][0]
    positions = range(len(devices))
    axis.bar([p - 0.2 for p in positions], [b / 1e6 for b in raw], 0.4, label="raw (dense fp32)")
    axis.bar([p + 0.2 for p in positions], [b / 1e6 for b in wire], 0.4, label="wire (sent)")
    for position, raw_bytes, wire_bytes in zip(positions, raw, wire, strict=True):
        ratio = f"{raw_bytes / wire_bytes:.1f}×" if wire_bytes else "nothing sent"
        axis.text(position, max(raw_bytes, wire_bytes) / 1e6, ratio, ha="center", va="bottom")
    axis.set_xticks(list(positions), devices)
    axis.set_ylabel("MB over the run")
    axis.set_title("Gradient bytes: raw vs wire (label: compression ratio)")
    axis.margins(y=0.15)
    axis.legend(loc="upper right")
    return figure


def _plot_series(axis: Any, series_list: list[Series], scale: float, *names: str) -> None:
    for series in sorted(series_list, key=lambda s: sorted(s.labels.items())):
        start = series.times_seconds[0]
        axis.plot(
            [t - start for t in series.times_seconds],
            [v * scale for v in series.values],
            label=_series_label(series, *names),
        )
    if series_list:
        axis.legend(fontsize=7)


def plot_throughput(run: RunData) -> Figure | None:
    """Examples per second: over time per device (Prometheus) or per epoch (summary)."""
    figure, axes = _figure()
    axis = axes[0][0]
    if run.series.get("throughput"):
        _plot_series(axis, run.series["throughput"], 1.0, "device")
        axis.set_xlabel("seconds since the run's first sample")
    elif run.epochs and any(math.isfinite(e.examples_per_second) for e in run.epochs):
        axis.bar([e.epoch for e in run.epochs], [e.examples_per_second for e in run.epochs])
        axis.set_xlabel("epoch")
    else:
        return None
    axis.set_ylabel("examples/s")
    axis.set_title("Throughput")
    return figure


def plot_loss_and_accuracy(run: RunData) -> Figure | None:
    """Training loss and validation accuracy, over time or per epoch."""
    figure, axes = _figure(1, 2)
    loss_axis, accuracy_axis = axes[0]
    if run.series.get("loss"):
        _plot_series(loss_axis, run.series["loss"], 1.0, "device", "rank")
        _plot_series(accuracy_axis, run.series.get("val_accuracy", []), 100.0, "device")
        loss_axis.set_xlabel("seconds since the run's first sample")
        accuracy_axis.set_xlabel("seconds since the run's first sample")
    elif run.epochs:
        epochs = [e.epoch for e in run.epochs]
        loss_axis.plot(epochs, [e.loss for e in run.epochs], marker="o", label="training")
        loss_axis.plot(epochs, [e.val_loss for e in run.epochs], marker="o", label="validation")
        loss_axis.legend(fontsize=7)
        accuracy_axis.plot(epochs, [100 * e.val_accuracy for e in run.epochs], marker="o")
        loss_axis.set_xlabel("epoch")
        accuracy_axis.set_xlabel("epoch")
    else:
        return None
    loss_axis.set_title("Loss")
    accuracy_axis.set_title("Validation accuracy (%)")
    return figure


def plot_resources(run: RunData) -> Figure | None:
    """CPU, memory, network and disk reads per device over the run (Prometheus only)."""
    if not any(run.series.get(name) for name in ("cpu", "memory", "network_transmit", "disk_read")):
        return None
    figure, axes = _figure(2, 2)
    views = [
        (axes[0][0], ["cpu"], 100.0, "CPU busy (%)"),
        (axes[0][1], ["memory"], 1e-6, "memory used (MB)"),
        (
            axes[1][0],
            ["network_transmit", "network_receive"],
            1e-6,
            "network sent / received (MB/s)",
        ),
        (axes[1][1], ["disk_read"], 1e-6, "disk read (MB/s)"),
    ]
    for axis, names, scale, title in views:
        for name in names:
            for series in run.series.get(name, []):
                start = series.times_seconds[0]
                suffix = {"network_transmit": " sent", "network_receive": " received"}.get(name, "")
                axis.plot(
                    [t - start for t in series.times_seconds],
                    [v * scale for v in series.values],
                    label=series.labels.get("device", "") + suffix,
                )
        axis.set_title(title)
        if axis.lines:
            axis.legend(fontsize=7)
    for axis in axes[1]:
        axis.set_xlabel("seconds since the run's first sample")
    return figure


def plot_stragglers(run: RunData) -> Figure | None:
    """Per rank: mean step time and local work per step (every phase but the exchange)."""
    ranks = [r for r in sorted(run.ranks, key=lambda r: r.rank) if r.steps > 0]
    if not ranks:
        return None
    figure, axes = _figure()
    axis = axes[0][0]
    positions = range(len(ranks))
    axis.bar(
        [p - 0.2 for p in positions], [1000 * r.step_seconds for r in ranks], 0.4, label="step"
    )
    axis.bar(
        [p + 0.2 for p in positions],
        [1000 * r.local_step_seconds for r in ranks],
        0.4,
        label="local work (step minus exchange)",
    )
    axis.set_xticks(list(positions), [f"{r.device}\nrank {r.rank}" for r in ranks])
    axis.set_ylabel("ms per step")
    axis.set_title("Stragglers: the rank with the most local work holds the others back")
    axis.legend()
    return figure


# ------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class View:
    """One section of the report: a heading, a PNG file and the function that draws it."""

    heading: str
    file_name: str
    plot: Callable[[RunData], Figure | None]
    missing: str


VIEWS: tuple[View, ...] = (
    View(
        "Step time by phase",
        "step_time_by_phase.png",
        plot_step_time_by_phase,
        "no steps were recorded",
    ),
    View(
        "Step time by phase over time",
        "step_time_over_time.png",
        plot_step_time_over_time,
        "needs Prometheus (a run summary has no time series)",
    ),
    View(
        "Gradient exchange",
        "gradient_bytes.png",
        plot_gradient_bytes,
        "no gradient bytes were recorded",
    ),
    View("Throughput", "throughput.png", plot_throughput, "no throughput was recorded"),
    View("Loss and accuracy", "loss_accuracy.png", plot_loss_and_accuracy, "no loss was recorded"),
    View(
        "Device resources",
        "resources.png",
        plot_resources,
        "needs Prometheus (a run summary holds no CPU, memory, network or disk figures)",
    ),
    View("Stragglers", "stragglers.png", plot_stragglers, "no steps were recorded"),
)


def _figure_png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _phase_table(run: RunData) -> list[str]:
    lines = [
        "| device | " + " | ".join(PHASES) + " | waiting for peers | step |",
        "|---|" + "---:|" * (len(PHASES) + 2),
    ]
    for profile in device_profiles(run):
        cells = [f"{1000 * profile.own_seconds[phase]:.1f}" for phase in PHASES]
        step_seconds = sum(profile.own_seconds.values()) + profile.peer_wait_seconds
        lines.append(
            f"| {profile.device} | "
            + " | ".join(cells)
            + f" | {1000 * profile.peer_wait_seconds:.1f} | {1000 * step_seconds:.1f} |"
        )
    lines += [
        "",
        "Milliseconds per step, averaged over the ranks of each device. The exchange column is "
        "its transfer time, the least exchange time per step of any rank; what a rank spent in "
        "the exchange beyond that was waiting for slower peers.",
    ]
    return lines


def _bytes_table(run: RunData) -> list[str]:
    lines = ["| device | raw MB | wire MB | compression ratio |", "|---|---:|---:|---:|"]
    for device in run.devices():
        raw = sum(r.gradient_bytes_raw for r in run.ranks if r.device == device)
        wire = sum(r.gradient_bytes_wire for r in run.ranks if r.device == device)
        ratio = f"{raw / wire:.2f}" if wire else "n/a"
        lines.append(f"| {device} | {raw / 1e6:.2f} | {wire / 1e6:.2f} | {ratio} |")
    return lines


def _rank_table(run: RunData) -> list[str]:
    lines = [
        "| rank | device | steps | skipped | examples | ms per step | local ms per step |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for rank in sorted(run.ranks, key=lambda r: r.rank):
        lines.append(
            f"| {rank.rank} | {rank.device} | {rank.steps:.0f} | {rank.skipped_steps:.0f} | "
            f"{rank.examples:.0f} | {1000 * rank.step_seconds:.1f} | "
            f"{1000 * rank.local_step_seconds:.1f} |"
        )
    return lines


def write_report(run: RunData, out_dir: Path) -> Path:
    """Write OUT_DIR/report.md and one PNG per view that has data; return the markdown's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bottlenecks = device_bottlenecks(run)
    lines = [f"# globaldl run {run.run_id}", "", f"Source: {run.source}.", "", "## Bottleneck", ""]
    lines += [f"- {b.sentence()}" for b in bottlenecks] or ["- No step time was recorded."]
    lines += [
        "",
        "The bottleneck is the phase with the largest share of a device's own step time, the "
        "exchange counting only its transfer time, not waiting for slower peers "
        "(globaldl.monitoring.phases; in Prometheus, globaldl:bottleneck_share:ratio). "
        "Per-step means leave each rank's first step out where it was recorded: it traces the "
        "step and waits for Horovod's first negotiation.",
    ]
    tables: Mapping[str, list[str]] = {
        "Step time by phase": _phase_table(run),
        "Gradient exchange": _bytes_table(run),
        "Stragglers": _rank_table(run),
    }
    for view in VIEWS:
        lines += ["", f"## {view.heading}", ""]
        figure = view.plot(run)
        if figure is None:
            lines.append(f"Not shown: {view.missing}.")
        else:
            write_bytes_atomically(out_dir / view.file_name, _figure_png(figure))
            lines.append(f"![{view.heading}]({view.file_name})")
        if view.heading in tables:
            lines += ["", *tables[view.heading]]
    path = out_dir / "report.md"
    write_text_atomically(path, "\n".join(lines) + "\n")
    return path
