"""Where benchmark and experiment numbers go: JSON for machines, markdown for people, atomic."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from globaldl.files import write_json_atomically, write_text_atomically
from globaldl.markdown import markdown_table


def machine_description() -> dict[str, Any]:
    """The machine a number was measured on: CPU, cores, memory, software versions.

    Versions come from the installed distributions, so writing results never loads
    TensorFlow or Horovod (seconds of start-up for a report).
    """
    import psutil

    import globaldl

    cpuinfo = _first_cpu_fields()
    return {
        "cpu": cpuinfo.get("model name") or platform.processor() or "unknown",
        # Virtual machines' CPUs often name only the vendor ("AMD EPYC"); family, model and
        # stepping tell their generations apart (hosts here differed 4.7-15x on one run).
        "cpu_signature": " ".join(
            f"{name.replace('cpu ', '')} {cpuinfo[name]}"
            for name in ("cpu family", "model", "stepping")
            if name in cpuinfo
        ),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        # What the fleet's connections pace and grow their windows by (network namespaces
        # start with the host's): the simulator's TCP model depends on it.
        "tcp_congestion_control": _tcp_congestion_control(),
        "python": platform.python_version(),
        "tensorflow": _installed_version("tensorflow"),
        "horovod": _installed_version("horovod"),
        "globaldl": globaldl.__version__,
    }


def _tcp_congestion_control(
    setting: Path = Path("/proc/sys/net/ipv4/tcp_congestion_control"),
) -> str:
    """The kernel's default TCP congestion control (`bbr`, `cubic`), or "unknown"."""
    try:
        return setting.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _first_cpu_fields(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's `name: value` lines of /proc/cpuinfo ({} where unreadable)."""
    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break
        name, separator, value = line.partition(":")
        if separator:
            fields.setdefault(name.strip(), value.strip())
    return fields


def _installed_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """The median of `values` with their min and max (all None where there are none)."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_results(
    out_dir: Path,
    name: str,
    title: str,
    rows: Sequence[Mapping[str, Any]],
    notes: str = "",
    command: str = "",
    columns: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
    markdown_rows: Sequence[Mapping[str, Any]] | None = None,
    machine: Mapping[str, Any] | None = None,
    json_indent: int | None = 2,
) -> tuple[Path, Path]:
    """Write `name`.json and `name`.md into `out_dir` (atomically); return both paths.

    `json_indent=None` writes the JSON compact (an experiment's record of every run).

    The markdown table shows `markdown_rows` when given (e.g. values with their ranges as
    text), else `rows`; the JSON always holds `rows`. `machine` is the machine the numbers
    were measured on (default: this one; a report rebuilt elsewhere passes the original).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = dict(machine or machine_description())
    document = {
        "title": title,
        "command": command,
        "machine": machine,
        "rows": list(rows),
        **(extra or {}),
    }
    json_path = out_dir / f"{name}.json"
    write_json_atomically(json_path, document, indent=json_indent)
    machine_line = ", ".join(f"{key} {value}" for key, value in machine.items())
    text = f"# {title}\n\n"
    if command:
        text += f"Measured with `{command}`\n\n"
    shown = rows if markdown_rows is None else markdown_rows
    text += f"Machine: {machine_line}.\n\n" + markdown_table(shown, columns)
    if notes:
        text += "\n" + notes.strip() + "\n"
    md_path = out_dir / f"{name}.md"
    write_text_atomically(md_path, text)
    return json_path, md_path
