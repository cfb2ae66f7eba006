"""Write the simulator's results: calibration error table, projection tables, plots, README text."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from globaldl.bench.results import markdown_table
from globaldl.experiments.outputs import save_figure, write_csv
from globaldl.monitoring.files import write_text_atomically
from globaldl.simulate.calibration import MAX_MEDIAN_ERROR, Calibration, SimParameters
from globaldl.summary import write_json_atomically

DEFAULT_OUT_DIR = Path(__file__).resolve().parents[2] / "results" / "projection"
PARAMETERS_FILE = "calibration.json"
README_BEGIN = "<!-- simulate:projection:begin -->"
README_END = "<!-- simulate:projection:end -->"
ERROR_COLUMNS = (
    "role",
    "experiment",
    "label",
    "model",
    "codec",
    "exchange",
    "devices",
    "cpu_cores",
    "link",
    "cycle_time_ms",
    "measured_step_seconds",
    "simulated_step_seconds",
    "error",
)
PROJECTION_COLUMNS = (
    "devices",
    "mode",
    "step_seconds",
    "coordination_seconds",
    "collective_seconds",
    "compute_seconds",
    "seconds_to_target",
    "device_tx_bytes_per_step",
    "examples_per_second",
    "times_out",
)


def read_parameters(path: Path) -> SimParameters:
    """Fitted parameters from a calibration JSON, or a clear error."""
    import json

    if not Path(path).is_file():
        raise ValueError(f"{path}: no calibration yet; run `globaldl simulate calibrate` first")
    return SimParameters.from_config(json.loads(Path(path).read_text())["parameters"])


def write_calibration(out_dir: Path, calibration: Calibration, command: str) -> Path:
    """calibration.json (parameters + every row), calibration.md, calibration.csv, a plot."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "command": command,
        "parameters": calibration.parameters.get_config(),
        "fit_median_abs_error": calibration.fit_median_error,
        "held_out_median_abs_error": calibration.held_out_median_error,
        "error_target": f"held-out median |error| <= {MAX_MEDIAN_ERROR:.0%}",
        "error_target_met": calibration.error_target_met,
        "rankings_preserved": calibration.rankings_preserved,
        "rankings": calibration.rankings,
        "rows": calibration.rows,
    }
    write_json_atomically(out_dir / PARAMETERS_FILE, document)
    write_csv(out_dir / "calibration.csv", calibration.rows, ERROR_COLUMNS)
    write_text_atomically(out_dir / "calibration.md", calibration_markdown(calibration, command))
    save_figure(out_dir / "calibration.png", lambda figure: _draw_errors(figure, calibration.rows))
    return out_dir / PARAMETERS_FILE


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def calibration_markdown(calibration: Calibration, command: str) -> str:
    """The error table and the ranking check as markdown."""
    parameters = calibration.parameters
    ranking_rows = [
        {key: value for key, value in ranking.items() if key != "discordant"}
        | {"discordant": "; ".join(ranking["discordant"]) or "-"}
        for ranking in calibration.rankings
    ]
    return (
        "# Simulator calibration\n\n"
        f"Made with `{command}`. Fitted on {', '.join(parameters.fitted_on)}; every other run "
        "is held out.\n\n"
        "| parameter | value |\n|---|---|\n"
        f"| SimGrid bandwidth factor (TCP payload efficiency on the shaped rate) | "
        f"{parameters.bandwidth_factor:g} |\n"
        f"| SimGrid latency factor | {parameters.latency_factor:g} "
        f"({'fitted' if parameters.latency_fitted else 'LV08 default: no run had latency'}) |\n"
        f"| CPU seconds per Gloo message | {parameters.message_cpu_seconds:g} |\n"
        f"| CPU seconds of Horovod's background loop per cycle | "
        f"{parameters.cycle_cpu_seconds:g} |\n"
        f"| extra seconds per bulk message (ACKs behind queued data) | "
        f"{parameters.bulk_message_seconds:g} |\n"
        f"| coordination bytes per device per cycle (measured) | "
        f"{parameters.coordination_bytes_per_cycle:g} |\n\n"
        f"Median |error| of step time: fit {calibration.fit_median_error:.1%}, held out "
        f"**{calibration.held_out_median_error:.1%}** (target <= {MAX_MEDIAN_ERROR:.0%}: "
        f"**{_verdict(calibration.error_target_met)}**). Rankings of every held-out experiment "
        f"preserved: **{_verdict(calibration.rankings_preserved)}**.\n\n"
        "## Ranking per held-out experiment\n\n"
        + markdown_table(ranking_rows)
        + "\n## Every run\n\n"
        + markdown_table(calibration.rows, ERROR_COLUMNS)
    )


def _draw_errors(figure: Any, rows: Sequence[Mapping[str, Any]]) -> None:
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
    low = min(min(row["measured_step_seconds"], row["simulated_step_seconds"]) for row in rows)
    high = max(max(row["measured_step_seconds"], row["simulated_step_seconds"]) for row in rows)
    axes.plot([low, high], [low, high], color="grey", linewidth=0.8)
    axes.plot([low, high], [low * 1.1, high * 1.1], color="grey", linewidth=0.5, linestyle=":")
    axes.plot([low, high], [low * 0.9, high * 0.9], color="grey", linewidth=0.5, linestyle=":")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("fleet step seconds (measured)")
    axes.set_ylabel("simulated step seconds")
    axes.set_title("Simulated against measured step time (dotted: +-10%)")
    axes.legend()


def write_projection(
    out_dir: Path,
    name: str,
    rows: Sequence[Mapping[str, Any]],
    crossover_rows: Sequence[Mapping[str, Any]],
    header: Mapping[str, Any],
) -> Path:
    """NAME.json, NAME.csv, NAME.md and NAME.png (step time and time to target vs devices)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomically(
        out_dir / f"{name}.json",
        {**header, "rows": list(rows), "crossovers": list(crossover_rows)},
    )
    write_csv(out_dir / f"{name}.csv", rows)
    text = (
        f"# Projection: {header['title']}\n\n"
        f"Made with `{header['command']}`; parameters from {header['parameters_file']}.\n\n"
        + markdown_table(rows, PROJECTION_COLUMNS)
        + "\n## Where each exchange mode stops paying off\n\n"
        + markdown_table(crossover_rows)
    )
    write_text_atomically(out_dir / f"{name}.md", text)
    save_figure(
        out_dir / f"{name}.png",
        lambda figure: _draw_projection(figure, rows, header["title"]),
        width_inches=11.0,
    )
    return out_dir / f"{name}.md"


def _draw_projection(figure: Any, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    panels = (
        ("step_seconds", "seconds per step"),
        ("device_tx_bytes_per_step", "bytes sent per device per step"),
        ("examples_per_second", "examples per second (whole run)"),
    )
    for index, (column, label) in enumerate(panels, start=1):
        axes = figure.add_subplot(1, len(panels), index)
        for mode in sorted({row["mode"] for row in rows}):
            series = sorted(
                (row for row in rows if row["mode"] == mode), key=lambda row: row["devices"]
            )
            line = axes.plot(
                [row["devices"] for row in series], [row[column] for row in series], marker="o"
            )
            timed_out = [row for row in series if row["times_out"]]
            axes.scatter(
                [row["devices"] for row in timed_out],
                [row[column] for row in timed_out],
                marker="x",
                s=80,
                color=line[0].get_color(),
            )
            line[0].set_label(mode)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("devices")
        axes.set_ylabel(label)
    figure.axes[0].legend(fontsize=7)
    figure.suptitle(f"{title} (x: times out)")


def readme_section(summaries: Sequence[Mapping[str, Any]], calibration_line: str) -> str:
    """The README's generated answer: devices per link class and the exchange each needs."""
    lines = [
        README_BEGIN,
        "",
        calibration_line,
        "",
        "| link | largest run that still gains throughput | with exchange | step there | "
        "first size that times out (all modes) |",
        "|---|---|---|---|---|",
    ]
    for summary in summaries:
        lines.append(
            f"| {summary['link']} | {summary['best_devices'] or 'none'} devices | "
            f"{summary['best_mode'] or '-'} | {summary['step_text']} | "
            f"{summary['timeout_devices'] or 'none projected'} |"
        )
    lines += ["", README_END]
    return "\n".join(lines)


def refresh_readme(readme: Path, section: str) -> bool:
    """Replace the generated section between its markers; False when the markers are missing."""
    text = Path(readme).read_text()
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(text):
        return False
    write_text_atomically(Path(readme), pattern.sub(lambda _: section, text))
    return True
