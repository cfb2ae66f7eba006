"""Horovod host files as horovodrun 0.28.1 reads them: every line `HOST slots=N`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(r"^(?P<host>\S+)\s+slots=(?P<slots>\d+)$")


@dataclass(frozen=True)
class HostEntry:
    """One line of a host file: where ranks run, and how many."""

    host: str
    slots: int


def read_hostfile(path: Path) -> list[HostEntry]:
    """The entries of `path`; ValueError naming the first line horovodrun would misread.

    horovodrun 0.28.1 splits every line on whitespace and `=`, so a comment, a blank line or a
    missing `slots=` breaks the launch with an IndexError; they are refused here by line number.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ValueError(f"cannot read host file {path}: {error.strerror}") from None
    entries: list[HostEntry] = []
    for number, line in enumerate(lines, start=1):
        match = _LINE.match(line.strip())
        if match is None or int(match["slots"]) < 1:
            raise ValueError(
                f"{path} line {number} ({line!r}) is not `HOST slots=N` with N >= 1; horovodrun "
                "reads every line that way (no comments, no blank lines)"
            )
        entries.append(HostEntry(match["host"], int(match["slots"])))
    if not entries:
        raise ValueError(f"host file {path} lists no hosts")
    hosts = [entry.host for entry in entries]
    duplicates = sorted({host for host in hosts if hosts.count(host) > 1})
    if duplicates:
        raise ValueError(f"host file {path} lists {', '.join(duplicates)} more than once")
    return entries
