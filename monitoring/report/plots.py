"""The run report's plots: one matplotlib figure per view, rendered to PNG bytes."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib

# Figures are made with matplotlib's object API and rendered by Agg into PNG bytes: no pyplot,
# no global figure state, no window.
from matplotlib.figure import Figure

from globaldl.monitoring.phases import PHASES
from globaldl.monitoring.promql import Series
from globaldl.monitoring.report.data import RunData, device_profiles, round_lateness

PHASE_COLOURS = dict(zip(PHASES, matplotlib.colormaps["tab10"].colors, strict=False))


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


def plot_round_handovers(run: RunData) -> Figure | None:
    """Per round: how long after the round's first rank each rank handed its delta over."""
    lateness = round_lateness(run)
    if not lateness:
        return None
    figure, axes = _figure()
    axis = axes[0][0]
    for rank in range(len(lateness[0])):
        axis.plot(
            range(len(lateness)),
            [1000 * round_times[rank] for round_times in lateness],
            marker=".",
            label=f"rank {rank} {run.rank_device(rank) or ''}".strip(),
        )
    axis.set_xlabel("round")
    axis.set_ylabel("ms after the round's first rank")
    axis.set_title("Round hand-overs: the exchange starts after the last rank's")
    axis.legend(fontsize="small")
    return figure


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
    View(
        "Round hand-overs",
        "round_handovers.png",
        plot_round_handovers,
        "needs a run summary with local steps (`--sync-every` > 1) that records every rank's "
        "round times (`rounds.rank_round_unix_seconds`)",
    ),
)


def figure_png(figure: Figure) -> bytes:
    """The figure as PNG bytes (100 dpi, laid out tight)."""
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
