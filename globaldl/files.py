"""Atomic file writes: a reader (a person, Prometheus, another rank) never sees half a file.

One behaviour for every file globaldl writes: the content goes to a temporary file in the
target's directory, is flushed and fsync'ed, gets its final permissions (`mode`, 0o644 unless
the caller keeps a secret), and is renamed over the target; then the directory is fsync'ed so
the rename itself survives a power cut. A failure at any point leaves the old file (or none)
and no temporary behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_MODE = 0o644


@contextmanager
def atomic_path(path: Path, mode: int = DEFAULT_MODE) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends, make it `path` atomically.

    For writers that want a file name rather than bytes (e.g. `tf.io.TFRecordWriter`); the
    writer must have closed the file when the block ends. On an exception the temporary file
    is removed and `path` is left as it was.
    """
    path = Path(path)
    directory = path.resolve().parent
    handle, name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}-", suffix=".tmp")
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)


def write_bytes_atomically(path: Path, data: bytes, mode: int = DEFAULT_MODE) -> None:
    """Write `data` to `path` atomically, with permissions `mode`."""
    with atomic_path(path, mode) as temporary:
        temporary.write_bytes(data)


def write_text_atomically(path: Path, text: str, mode: int = DEFAULT_MODE) -> None:
    """Write UTF-8 `text` to `path` atomically, with permissions `mode`."""
    write_bytes_atomically(path, text.encode("utf-8"), mode)


def write_json_atomically(
    path: Path, document: Any, mode: int = DEFAULT_MODE, *, indent: int | None = 2
) -> None:
    """Write `document` as JSON with sorted keys and a final newline, atomically.

    Indented by default; `indent=None` writes it compact (large machine-read records).
    """
    separators = (",", ":") if indent is None else None
    text = json.dumps(document, indent=indent, sort_keys=True, separators=separators)
    write_text_atomically(path, text + "\n", mode)


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # some file systems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
