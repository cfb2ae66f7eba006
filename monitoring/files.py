"""Atomic file writes: a reader (Prometheus, Grafana, a person) never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file in the same directory, then rename it over `path`."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    """Write UTF-8 `text` atomically (see write_bytes_atomically)."""
    write_bytes_atomically(path, text.encode("utf-8"))
