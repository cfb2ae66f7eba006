"""The simulator's plots: calibration scatter, and a projection's curves against device count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# (column, axis label) of each projection panel; the time-to-target panel adds a dashed line.
PROJECTION_PANELS = (
    ("step_seconds", "seconds per step"),
    ("seconds_to_target_same_steps", "seconds to target accuracy"),
    ("device_tx_bytes_per_step", "bytes each device sends per step"),
    ("examples_per_second", "examples per second (whole run)"),
)


def draw_calibration(figure: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """Simulated against measured step time, fit and held-out runs apart, +-10% band."""
    axes = figure.add_subplot(1, 1, 1)
    for role, marker in (("fit", "o"), ("held out", "s")):
        chosen = [row for row in rows if row["role"] == role]
        axes.scatter(
            [row["measured_step_seconds"] for row in chosen],
            [row["simulated_step_seconds"] for row in chosen],
            marker=marker,
            label=role,
            alpha=0.7,
        )
    values = [
        row[key] for row in rows for key in ("measured_step_seconds", "simulated_step_seconds")
    ]
    low, high = min(values), max(values)
    axes.plot([low, high], [low, high], color="grey", linewidth=0.8)
    for factor in (1.1, 0.9):
        axes.plot(
            [low, high], [low * factor, high * factor], color="grey", linewidth=0.5, linestyle=":"
        )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("fleet step seconds (measured)")
    axes.set_ylabel("simulated step seconds")
    axes.set_title("Simulated against measured step time (dotted: +-10%)")
    axes.legend()


def draw_projection(
    figure: Any, rows: Sequence[Mapping[str, Any]], pays_off: Mapping[str, int | None], title: str
) -> None:
    """Four panels against devices, one line per mode; x: times out, circled: pays off there."""
    modes = sorted({row["mode"] for row in rows})
    for index, (column, label) in enumerate(PROJECTION_PANELS, start=1):
        axes = figure.add_subplot(2, 2, index)
        for mode in modes:
            series = sorted(
                (row for row in rows if row["mode"] == mode), key=lambda row: row["devices"]
            )
            points = [(row["devices"], row[column]) for row in series if row[column] is not None]
            if not points:
                continue
            (line,) = axes.plot(*zip(*points, strict=True), marker="o", markersize=3, label=mode)
            if column == "seconds_to_target_same_steps":
                dashed = [
                    (row["devices"], row["seconds_to_target_same_examples"])
                    for row in series
                    if row["seconds_to_target_same_examples"] is not None
                ]
                if dashed:
                    axes.plot(*zip(*dashed, strict=True), linestyle="--", color=line.get_color())
            timed_out = [(row["devices"], row[column]) for row in series if row["times_out"]]
            timed_out = [(x, y) for x, y in timed_out if y is not None]
            if timed_out:
                axes.scatter(
                    *zip(*timed_out, strict=True), marker="x", s=60, color=line.get_color()
                )
            best = [(x, y) for x, y in points if x == pays_off.get(mode)]
            if best:
                axes.scatter(
                    *zip(*best, strict=True), s=120, facecolors="none", edgecolors=line.get_color()
                )
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("devices")
        axes.set_ylabel(label, fontsize=8)
        axes.tick_params(labelsize=7)
    figure.axes[0].legend(fontsize=7)
    figure.axes[1].set_title(
        "solid: measured steps to target hold; dashed: measured examples hold", fontsize=7
    )
    figure.suptitle(f"{title}\nx: times out (Gloo), circle: largest count that still pays off")
