"""The run report itself: markdown with the bottleneck sentences, tables and the plots' PNGs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from globaldl.files import write_bytes_atomically, write_text_atomically
from globaldl.markdown import markdown_table
from globaldl.monitoring.phases import PHASES
from globaldl.monitoring.report.data import (
    RunData,
    device_bottlenecks,
    device_profiles,
    rank_handovers,
)
from globaldl.monitoring.report.plots import VIEWS, figure_png


def _milliseconds(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def _phase_table(run: RunData) -> str:
    columns = ["device", *PHASES, "waiting for peers", "step"]
    rows = []
    for profile in device_profiles(run):
        step_seconds = sum(profile.own_seconds.values()) + profile.peer_wait_seconds
        rows.append(
            {
                "device": profile.device,
                **{phase: _milliseconds(profile.own_seconds[phase]) for phase in PHASES},
                "waiting for peers": _milliseconds(profile.peer_wait_seconds),
                "step": _milliseconds(step_seconds),
            }
        )
    return markdown_table(rows, columns, right_aligned=columns[1:]) + (
        "\nMilliseconds per step, averaged over the ranks of each device. The exchange column is "
        "its transfer time, the least exchange time per step of any rank; what a rank spent in "
        "the exchange beyond that was waiting for slower peers."
    )


def _bytes_table(run: RunData) -> str:
    rows = []
    for device in run.devices():
        raw = sum(r.gradient_bytes_raw for r in run.ranks if r.device == device)
        wire = sum(r.gradient_bytes_wire for r in run.ranks if r.device == device)
        rows.append(
            {
                "device": device,
                "raw MB": f"{raw / 1e6:.2f}",
                "wire MB": f"{wire / 1e6:.2f}",
                "compression ratio": f"{raw / wire:.2f}" if wire else "n/a",
            }
        )
    columns = ["device", "raw MB", "wire MB", "compression ratio"]
    return markdown_table(rows, columns, right_aligned=columns[1:])


def _rank_table(run: RunData) -> str:
    rows = [
        {
            "rank": rank.rank,
            "device": rank.device,
            "steps": f"{rank.steps:.0f}",
            "skipped": f"{rank.skipped_steps:.0f}",
            "examples": f"{rank.examples:.0f}",
            "ms per step": _milliseconds(rank.step_seconds),
            "local ms per step": _milliseconds(rank.local_step_seconds),
        }
        for rank in sorted(run.ranks, key=lambda r: r.rank)
    ]
    columns = ["rank", "device", "steps", "skipped", "examples", "ms per step", "local ms per step"]
    right = [column for column in columns if column != "device"]
    return markdown_table(rows, columns, right_aligned=right)


def _handover_table(run: RunData) -> str:
    rows = [
        {
            "rank": row.rank,
            "device": row.device,
            "rounds": row.rounds,
            "rounds last": row.rounds_last,
            "median ms after the first": _milliseconds(row.median_after_first_seconds),
            "max ms after the first": _milliseconds(row.max_after_first_seconds),
        }
        for row in rank_handovers(run)
    ]
    if not rows:
        return ""
    columns = list(rows[0])
    right = [column for column in columns if column != "device"]
    return markdown_table(rows, columns, right_aligned=right) + (
        "\nWhen each rank handed a round's delta over, against the round's first rank (every "
        "rank's clock; the devices of an emulated fleet read one). A round's exchange starts "
        "after its last rank's: a rank that is last in most rounds is the one the others wait "
        "for."
    )


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
    tables: Mapping[str, str] = {
        "Step time by phase": _phase_table(run),
        "Gradient exchange": _bytes_table(run),
        "Stragglers": _rank_table(run),
        "Round hand-overs": _handover_table(run),
    }
    for view in VIEWS:
        lines += ["", f"## {view.heading}", ""]
        figure = view.plot(run)
        if figure is None:
            lines.append(f"Not shown: {view.missing}.")
        else:
            write_bytes_atomically(out_dir / view.file_name, figure_png(figure))
            lines.append(f"![{view.heading}]({view.file_name})")
        if tables.get(view.heading):
            lines += ["", tables[view.heading]]
    path = out_dir / "report.md"
    write_text_atomically(path, "\n".join(lines) + "\n")
    return path
