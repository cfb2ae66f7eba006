"""The run summary: one JSON document per run, validated against its schema, written atomically."""

from __future__ import annotations

import json
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from globaldl.files import write_json_atomically

SCHEMA_VERSION = 1


class SummaryError(ValueError):
    """A summary does not match the schema, or cannot be written; the message says where."""


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON schema of the run summary, shipped inside the package."""
    text = resources.files("globaldl").joinpath("schemas/run_summary.schema.json").read_text()
    return json.loads(text)


def validate(summary: dict[str, Any]) -> None:
    """Raise SummaryError naming the first field that breaks the schema."""
    try:
        jsonschema.validate(summary, schema())
    except jsonschema.ValidationError as error:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise SummaryError(f"run summary field {where}: {error.message}") from error


def compression_ratio(raw_bytes: int, wire_bytes: int) -> float | None:
    """Dense fp32 bytes over bytes on the wire; None when nothing was sent."""
    return raw_bytes / wire_bytes if wire_bytes > 0 else None


def steady_phases(
    phases: dict[str, float], first_step: dict[str, float] | None, steps: int
) -> tuple[dict[str, float], int]:
    """Phases summed over a run's steady steps, and how many: the first step left out.

    The first step also waits for the slowest rank to trace its graph and for Horovod's first
    negotiation. Without its record (`first_step_phase_seconds`, absent from older summaries),
    or with only one step, every step counts.
    """
    if not first_step or steps < 2:
        return dict(phases), steps
    steady = {name: seconds - first_step.get(name, 0.0) for name, seconds in phases.items()}
    return {name: max(seconds, 0.0) for name, seconds in steady.items()}, steps - 1


def steady_step_seconds(summary: dict[str, Any]) -> float | None:
    """Rank 0's mean training step without its first; None where the first is not recorded.

    Epoch ends (validation, the epoch's small collectives) are outside the steps' phases.
    """
    totals = summary.get("rank_totals") or []
    first = totals[0].get("first_step_phase_seconds") if totals else None
    steps = int(summary.get("steps") or 0)
    if not first or steps < 2:
        return None
    phases, steady = steady_phases(summary["phase_seconds"], first, steps)
    return sum(phases.values()) / steady


def traffic(
    *,
    device_tx_bytes_per_step_model: float,
    dense_device_tx_bytes_per_step_model: float,
    payload_bytes_per_step: float,
    collectives_outside_steps: list[dict[str, Any]],
) -> dict[str, Any]:
    """The summary's `traffic` object: what one device sends per step, against dense Horovod.

    `device_tx_bytes_per_step_model` is what the step's collectives make the busiest device send
    for `payload_bytes_per_step` (ring allreduce 2(N-1)/N, ring allgather N-1, a site leader's
    share under a hierarchy: `globaldl.exchange.device_tx_bytes_per_step_model`); the dense
    figure is a fp32 ring allreduce of the same gradients on the same ranks. Their ratio is the
    per-device traffic ratio, which `compression_ratio` (payload bytes only) is not once N > 2.
    """
    model = device_tx_bytes_per_step_model
    dense = dense_device_tx_bytes_per_step_model
    return {
        "device_tx_bytes_per_step_model": model,
        "dense_device_tx_bytes_per_step_model": dense,
        "traffic_ratio_vs_dense": dense / model if model > 0 else None,
        "tx_bytes_per_wire_byte": model / payload_bytes_per_step if payload_bytes_per_step else 0.0,
        "collectives_outside_steps": collectives_outside_steps,
    }


def check_writable(path: Path) -> None:
    """Fail before training if the summary's directory cannot take the file."""
    directory = Path(path).resolve().parent
    if not directory.is_dir():
        raise SummaryError(f"summary path {path}: directory {directory} does not exist")
    if Path(path).is_dir():
        raise SummaryError(f"summary path {path} is a directory; give a file name")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as error:
        raise SummaryError(
            f"summary path {path}: directory {directory} is not writable ({error.strerror})"
        ) from error


def write(path: Path, summary: dict[str, Any]) -> None:
    """Validate, then write the summary atomically."""
    validate(summary)
    write_json_atomically(path, summary)


def read(path: Path) -> dict[str, Any]:
    """Read and validate a summary written by `write`."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SummaryError(f"cannot read run summary {path}: {error}") from error
    validate(summary)
    return summary
