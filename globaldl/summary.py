"""The run summary: one JSON document per run, validated against its schema, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

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


def traffic(
    *,
    combine: str,
    ranks: int,
    steps: int,
    gradient_bytes_raw: int,
    gradient_bytes_wire: int,
    collectives_outside_steps: list[dict[str, Any]],
) -> dict[str, Any]:
    """The summary's `traffic` object: what one device sends per step, against dense Horovod.

    `device_tx_bytes_per_step_model` is the step's wire bytes times what the collective makes a
    rank send (ring allreduce 2(N-1)/N, ring allgather N-1); the dense figure is a fp32 ring
    allreduce of the same gradients on the same ranks. Their ratio is the per-device traffic
    ratio, which `compression_ratio` (payload bytes only) is not once N > 2.
    """
    from globaldl.collectives import tx_bytes_per_wire_byte

    factor = tx_bytes_per_wire_byte(combine, ranks)
    dense_factor = tx_bytes_per_wire_byte("sum", ranks)
    model = factor * gradient_bytes_wire / steps if steps > 0 else 0.0
    dense = dense_factor * gradient_bytes_raw / steps if steps > 0 else 0.0
    return {
        "device_tx_bytes_per_step_model": model,
        "dense_device_tx_bytes_per_step_model": dense,
        "traffic_ratio_vs_dense": dense / model if model > 0 else None,
        "tx_bytes_per_wire_byte": factor,
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


def write_json_atomically(path: Path, document: Any) -> None:
    """Write JSON to a temporary file in the same directory, then rename it into place."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(document, stream, indent=2, sort_keys=True)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
