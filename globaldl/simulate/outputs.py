"""Write the simulator's results: calibration error table, projection tables, README section."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from globaldl.experiments.outputs import save_figure, write_csv
from globaldl.markdown import markdown_table
from globaldl.monitoring.files import write_text_atomically
from globaldl.simulate.calibration import (
    MAX_MEDIAN_ERROR,
    NOT_SCORED,
    Calibration,
    SimParameters,
)
from globaldl.simulate.platform import parse_speed_shares
from globaldl.simulate.plots import draw_calibration, draw_projection
from globaldl.simulate.projection import answer, best_modes, crossovers
from globaldl.summary import write_json_atomically

DEFAULT_OUT_DIR = Path(__file__).resolve().parents[2] / "results" / "projection"
DEFAULT_README = Path(__file__).resolve().parents[2] / "README.md"
PARAMETERS_FILE = "calibration.json"
PROJECTION_KIND = "globaldl simulate projection"
README_BEGIN = "<!-- simulate:projection:begin -->"
README_END = "<!-- simulate:projection:end -->"
ERROR_COLUMNS = (
    "role",
    "experiment",
    "label",
    "repeat",
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
    "simulated_cpu_seconds_per_step",
    "measured_cpu_seconds_per_step",
    "measured_compute_seconds",
    "simulated_compute_seconds",
)
PROJECTION_COLUMNS = (
    "devices",
    "mode",
    "step_seconds",
    "coordination_seconds",
    "collective_seconds",
    "compute_seconds",
    "seconds_to_target_same_steps",
    "seconds_to_target_same_examples",
    "device_tx_bytes_per_step",
    "examples_per_second",
    "longest_wait_seconds",
    "times_out",
)


def read_parameters(path: Path) -> SimParameters:
    """Fitted parameters from a calibration JSON, or a clear error."""
    if not Path(path).is_file():
        raise ValueError(f"{path}: no calibration yet; run `globaldl simulate calibrate` first")
    return SimParameters.from_config(json.loads(Path(path).read_text())["parameters"])


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def calibration_summary(document: Mapping[str, Any]) -> str:
    """One sentence: what the committed calibration was fitted on and how far off it is."""
    parameters = document["parameters"]
    return (
        f"held-out median |error| on step time {document['held_out_median_abs_error']:.1%} "
        f"(target <= {MAX_MEDIAN_ERROR:.0%}: {_verdict(document['error_target_met'])}), "
        f"rankings preserved: {_verdict(document['rankings_preserved'])}; bandwidth factor "
        f"{parameters['bandwidth_factor']:g}, fitted; TCP's pacing (BBR) not fitted"
    )


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
    save_figure(
        out_dir / "calibration.png", lambda figure: draw_calibration(figure, calibration.rows)
    )
    return out_dir / PARAMETERS_FILE


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
        f"is held out. Runs on one device ({NOT_SCORED}) have no exchange to simulate and are "
        "left out of the statistics.\n\n"
        "| parameter | value |\n|---|---|\n"
        f"| SimGrid bandwidth factor (TCP payload efficiency on the shaped rate) | "
        f"{parameters.bandwidth_factor:g} |\n"
        "| TCP's pacing on delayed links (BBR, `exchange.paced_seconds`) | measured, not "
        "fitted |\n"
        f"| CPU seconds per Gloo message | {parameters.message_cpu_seconds:g} |\n"
        f"| CPU seconds of Horovod's background loop per cycle | "
        f"{parameters.cycle_cpu_seconds:g} |\n"
        f"| coordination bytes per device per cycle (measured) | "
        f"{parameters.coordination_bytes_per_cycle:g} |\n\n"
        f"Median |error| of step time: fit {calibration.fit_median_error:.1%}, held out "
        f"**{calibration.held_out_median_error:.1%}** (target <= {MAX_MEDIAN_ERROR:.0%}: "
        f"**{_verdict(calibration.error_target_met)}**). Rankings of every held-out experiment "
        f"preserved: **{_verdict(calibration.rankings_preserved)}**.\n\n"
        "## Ranking per held-out experiment\n\n"
        "Configurations are ranked by the median step of their repeats. A pair is discordant when "
        "the simulator orders it unlike the fleet, or gives both the same step while the fleet "
        "does not (a simulated tie); `discordant_ranges_overlap` counts the pairs whose repeats "
        "the fleet itself orders both ways.\n\n"
        + markdown_table(ranking_rows)
        + "\n## Every run\n\n"
        + markdown_table(calibration.rows, ERROR_COLUMNS)
    )


def write_projection(
    out_dir: Path, name: str, rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any]
) -> Path:
    """NAME.json, NAME.csv, NAME.md and NAME.png: the rows, crossovers and the answer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    crossover_rows = crossovers(rows)
    best = best_modes(rows)
    document = {
        "kind": PROJECTION_KIND,
        **header,
        "answer": answer(rows),
        "crossovers": crossover_rows,
        "best_mode_per_device_count": best,
        "rows": list(rows),
    }
    write_json_atomically(out_dir / f"{name}.json", document)
    write_csv(out_dir / f"{name}.csv", rows)
    write_text_atomically(out_dir / f"{name}.md", projection_markdown(document))
    pays_off = {row["mode"]: row["pays_off_up_to_devices"] for row in crossover_rows}
    save_figure(
        out_dir / f"{name}.png",
        lambda figure: draw_projection(figure, rows, pays_off, header["title"]),
        width_inches=11.0,
        height_inches=8.0,
    )
    return out_dir / f"{name}.md"


def projection_markdown(document: Mapping[str, Any]) -> str:
    """A projection document as markdown."""
    found = document["answer"]
    verdict = (
        f"**{found['devices']} devices** with **{found['mode']}** "
        f"({found['step_seconds']:.3g} s per step{_to_target_note(found)})"
        if found["devices"]
        else "**no projected count** pays off"
    )
    return (
        f"# Projection: {document['title']}\n\n"
        f"Made with `{document['command']}` in {document['simulation_seconds']:.0f} s; "
        f"parameters from `{document['parameters_file']}` ({document['calibration']}).\n\n"
        f"Largest device count that still pays off: {verdict}. A count pays off when the run "
        "does not time out and gains at least 10% examples per second over the next smaller "
        "projected count. Time to target: `same_steps` assumes the fleet's measured steps to "
        "the target hold at any size, `same_examples` that its measured examples do (the truth "
        "for large global batches lies between).\n\n"
        + markdown_table(document["rows"], PROJECTION_COLUMNS)
        + "\n## Where each exchange mode stops paying off\n\n"
        + markdown_table(document["crossovers"])
        + "\n## Best mode per device count\n\n"
        + markdown_table(document["best_mode_per_device_count"])
    )


def projection_documents(out_dir: Path) -> list[dict[str, Any]]:
    """Every projection JSON in `out_dir`, by file name."""
    documents = []
    for path in sorted(Path(out_dir).glob("*.json")):
        document = json.loads(path.read_text())
        if isinstance(document, dict) and document.get("kind") == PROJECTION_KIND:
            documents.append(document | {"file": path.name})
    return documents


def readme_section(documents: Sequence[Mapping[str, Any]], out_dir_name: str) -> str:
    """The README's generated answer: devices per link mix and the exchange each needs."""
    lines = [README_BEGIN, ""]
    if not documents:
        lines += ["No projection yet: run `globaldl simulate project`.", "", README_END]
        return "\n".join(lines)
    rows = []
    # Per model and link mix, devices alike first, then the same links with other speeds.
    for document in sorted(documents, key=_readme_order):
        found = document["answer"]
        waits = ", ".join(
            f"{row['mode']} {row['longest_wait_seconds_at_largest']:.3g} s"
            for row in document["crossovers"]
        )
        largest = max(document["request"]["devices"])
        details = document["file"].removesuffix(".json")
        rows.append(
            {
                "link mix": document["request"]["mix"] + speeds_note(document["request"]),
                "devices one run can use": found["devices"] or "none of the projected counts",
                "exchange mode it needs": found["mode"] or "-",
                "step there": _seconds(found["step_seconds"]),
                "time to the target there": _seconds(found.get("seconds_to_target")),
                "longest wait for one message at the largest count, per mode": (
                    f"at {largest}: {waits}"
                ),
                "details": f"[{details}]({out_dir_name}/{details}.md)",
            }
        )
    lines += [
        f"Calibration behind these numbers: {documents[0]['calibration']}.",
        "",
        markdown_table(rows).rstrip("\n"),
    ]
    lines += [
        "",
        "Each row: the largest projected device count that does not hit Gloo's timeout "
        f"(HOROVOD_GLOO_TIMEOUT_SECONDS={documents[0]['request']['gloo_timeout_seconds']:g}) "
        "and still gains at least 10% examples per second over the next smaller count, "
        f"{documents[0]['request']['model']} at {documents[0]['request']['cpu_cores']:g} core "
        "per device. Regenerate: `globaldl simulate project ...` (commands in each details "
        "file), then `globaldl simulate readme`.",
        "",
        README_END,
    ]
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} s"


def _to_target_note(found: Mapping[str, Any]) -> str:
    seconds = found.get("seconds_to_target")
    return "" if seconds is None else f", {seconds:.3g} s to the target accuracy"


def _readme_order(document: Mapping[str, Any]) -> tuple[str, str, bool, str]:
    request = document["request"]
    return request["model"], request["mix"], bool(speeds_note(request)), document["file"]


def speeds_note(request: Mapping[str, Any]) -> str:
    """How a projection request's devices differ in speed and batch, where they do.

    `request` is a projection document's; older ones record neither: devices alike.
    """
    speeds = request.get("speeds", "1:100")
    note = "" if parse_speed_shares(speeds).is_uniform else f", device speeds {speeds}"
    return note + (", batches by speed" if request.get("balance") == "speed" else "")


def refresh_readme(readme: Path, section: str) -> bool:
    """Replace the generated section between its markers; False when the markers are missing."""
    text = Path(readme).read_text()
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(text):
        return False
    write_text_atomically(Path(readme), pattern.sub(lambda _: section, text))
    return True
