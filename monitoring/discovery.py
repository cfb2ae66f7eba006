"""File-based service discovery: the launcher writes one Prometheus target per rank."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from globaldl.files import write_text_atomically
from globaldl.monitoring.metrics import check_run_id


@dataclass(frozen=True)
class MetricsTarget:
    """Where one rank serves its metrics: HOST:PORT, with the rank Horovod will give it."""

    host: str
    port: int
    rank: int

    @property
    def address(self) -> str:
        """HOST:PORT as Prometheus wants it (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


def metrics_targets(hosts: Sequence[tuple[str, int]], base_port: int) -> list[MetricsTarget]:
    """One target per rank for `hosts` given as (host, slots), in Horovod's rank order.

    horovodrun numbers ranks host by host in the order of -H / the host file, and each rank
    serves on base_port + its local rank, so `[("a", 2), ("b", 1)]` with base 9400 gives
    a:9400 (rank 0), a:9401 (rank 1) and b:9400 (rank 2).
    """
    if isinstance(base_port, bool) or not isinstance(base_port, int) or not 1 <= base_port <= 65535:
        raise ValueError(f"base_port {base_port!r} is out of range; expected 1-65535")
    targets: list[MetricsTarget] = []
    for host, slots in hosts:
        if not host:
            raise ValueError(f"host {host!r} in {list(hosts)} must be a non-empty name or address")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"host {host!r} has {slots!r} slots; expected an integer >= 1")
        if base_port + slots - 1 > 65535:
            raise ValueError(
                f"host {host!r} with {slots} slots needs ports "
                f"{base_port}-{base_port + slots - 1}, past 65535"
            )
        first_rank = len(targets)
        targets.extend(
            MetricsTarget(host, base_port + local_rank, first_rank + local_rank)
            for local_rank in range(slots)
        )
    return targets


def write_targets(
    targets_dir: Path, *, run_id: str, hosts: Sequence[tuple[str, int]], base_port: int
) -> Path:
    """Write `targets_dir/RUN_ID.json` atomically, one file-SD entry per rank; return its path.

    Each entry carries `run` and `rank` labels, so even `up` says which worker is missing.
    The scrape job uses `honor_labels: true`, so the labels the worker exposes win.
    """
    check_run_id(run_id)
    targets = metrics_targets(hosts, base_port)
    document = [
        {"targets": [target.address], "labels": {"run": run_id, "rank": str(target.rank)}}
        for target in targets
    ]
    targets_dir = Path(targets_dir)
    targets_dir.mkdir(parents=True, exist_ok=True)
    path = targets_dir / f"{run_id}.json"
    write_text_atomically(path, json.dumps(document, indent=2) + "\n")
    return path


def remove_targets(targets_dir: Path, run_id: str) -> bool:
    """Delete the run's targets file (Prometheus then stops scraping it); True if it existed."""
    path = Path(targets_dir) / f"{check_run_id(run_id)}.json"
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """Parse horovodrun's -H syntax, "host1:2,host2:1" (slots default to 1), into (host, slots)."""
    parsed: list[tuple[str, int]] = []
    for entry in hosts.split(","):
        entry = entry.strip()
        host, separator, slots = entry.rpartition(":")
        if not separator:
            host, slots = entry, "1"
        if not host or not slots.isdigit() or int(slots) < 1:
            raise ValueError(
                f"host entry {entry!r} in {hosts!r} must look like HOST:SLOTS, e.g. localhost:2"
            )
        parsed.append((host, int(slots)))
    return parsed
