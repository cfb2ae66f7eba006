"""Measure what Horovod sends when no tensor is ready, and what launching a run costs, per device.

Horovod's background loop coordinates once per HOROVOD_CYCLE_TIME whether or not a tensor is
ready: the ranks allreduce a bit vector of cached tensors and, for new tensors, gather their
requests on rank 0 and broadcast the response (horovod/common/controller.cc,
gloo/gloo_controller.cc). Those messages are tiny and many, so most of their bytes on the wire
are Ethernet/IP/TCP headers, and each rank's share depends on its place in the ring and tree.

The probe (`python -m globaldl.fleet.coordination probe ...`, launched on every device by
horovodrun) starts Horovod's core without TensorFlow's Python layer (the same C++ library,
background loop and Gloo transport as training, seconds faster to start on a throttled
device), then reads its own interface counters: before `init`, after it, and over an idle
window. The launch cost is a `fleet run` of `true`: the ssh sessions horovodrun opens.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Ethernet (14) + IPv4 (20) + TCP (20) + the timestamp option (12, on by default in Linux): what
# every TCP packet on a fleet link carries besides its payload.
HEADER_BYTES_PER_PACKET = 66
PROBE_MODULE = "globaldl.fleet.coordination"


@dataclass(frozen=True)
class InterfaceDelta:
    """Bytes and packets an interface sent over a span of time."""

    tx_bytes: int
    tx_packets: int

    @property
    def payload_bytes(self) -> int:
        """TCP payload: the bytes beyond one header per packet."""
        return self.tx_bytes - HEADER_BYTES_PER_PACKET * self.tx_packets


def read_own_interface(interface: str) -> InterfaceDelta:
    """Cumulative tx bytes and packets of `interface` in this process's network namespace."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == interface:
            values = fields.split()
            return InterfaceDelta(tx_bytes=int(values[8]), tx_packets=int(values[9]))
    raise ValueError(f"no interface {interface!r} in /proc/net/dev of this namespace")


def _delta(before: InterfaceDelta, after: InterfaceDelta) -> InterfaceDelta:
    return InterfaceDelta(after.tx_bytes - before.tx_bytes, after.tx_packets - before.tx_packets)


def _horovod_core() -> Any:
    """Horovod's C++ core (HorovodBasics) without importing TensorFlow's Python layer.

    Horovod's TensorFlow extension links TensorFlow's two shared libraries; loading them with
    RTLD_GLOBAL first is all `import tensorflow` would have done for it, at a tenth of the
    start-up time on a throttled device.
    """
    tensorflow = importlib.util.find_spec("tensorflow")
    horovod = importlib.util.find_spec("horovod")
    if tensorflow is None or horovod is None or not horovod.submodule_search_locations:
        raise RuntimeError("the coordination probe needs tensorflow and horovod installed")
    tensorflow_dir = Path(next(iter(tensorflow.submodule_search_locations or [])))
    for library in ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2"):
        ctypes.CDLL(str(tensorflow_dir / library), mode=ctypes.RTLD_GLOBAL)
    from horovod.common.basics import HorovodBasics
    from horovod.common.process_sets import _setup as setup_process_sets

    horovod_dir = Path(next(iter(horovod.submodule_search_locations)))
    core = HorovodBasics(str(horovod_dir / "tensorflow" / "mpi_ops.py"), "mpi_lib")
    setup_process_sets(core)
    return core


def probe(out_dir: Path, settle_seconds: float, idle_seconds: float, interface: str) -> Path:
    """One rank's measurement: counters around init and over an idle window; a JSON per rank.

    Each span is recorded apart (init, settle, idle, shutdown), so that the host can also tell
    what the launch around them cost: the device's whole run minus these spans.
    """
    start = read_own_interface(interface)
    core = _horovod_core()
    core.init()
    initialised = read_own_interface(interface)
    # init returns on every rank within milliseconds (it ends in a rendezvous), so the idle
    # windows of all ranks overlap.
    time.sleep(settle_seconds)
    rank, size = core.rank(), core.size()
    timeline = Path(out_dir) / "cycles.timeline.json"
    # Rank 0 coordinates, and every rank runs the same cycles: its timeline marks each one
    # (possible only when Horovod started with HOROVOD_TIMELINE=DYNAMIC).
    counting = os.environ.get("HOROVOD_TIMELINE") == "DYNAMIC"
    if counting:
        core.start_timeline(str(timeline), mark_cycles=True)
    window_start, started = read_own_interface(interface), time.monotonic()
    time.sleep(idle_seconds)
    window_end, seconds = read_own_interface(interface), time.monotonic() - started
    if counting:
        core.stop_timeline()
    core.shutdown()
    finished = read_own_interface(interface)
    record = {
        "rank": rank,
        "ranks": size,
        "host": socket.gethostname(),
        "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", "1")),
        "init": asdict(_delta(start, initialised)),
        "settle": asdict(_delta(initialised, window_start)),
        "idle": asdict(_delta(window_start, window_end)),
        "idle_seconds": seconds,
        "shutdown": asdict(_delta(window_end, finished)),
    }
    if rank == 0 and counting:
        record["idle_cycles"] = count_cycles(timeline)
    path = Path(out_dir) / f"rank-{rank:05d}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record))
    os.replace(temporary, path)
    return path


def count_cycles(timeline: Path) -> int:
    """Horovod cycles a timeline recorded with cycle marks (its CYCLE_START markers)."""
    return Path(timeline).read_text().count('"name": "CYCLE_START"')


def probe_payload_bytes(record: dict[str, Any]) -> int:
    """TCP payload a rank's probe measured from before init to after shutdown."""
    return sum(
        InterfaceDelta(**record[span]).payload_bytes
        for span in ("init", "settle", "idle", "shutdown")
    )


@dataclass(frozen=True)
class IdleCoordination:
    """Horovod's idle coordination on `ranks` devices at one cycle time, rank by rank.

    Rates are per second of an idle window; `init_payload_bytes` is what each rank sent from
    before `hvd.init()` to its return (rendezvous, Gloo's connections, the first cycles).
    """

    ranks: int
    cycle_time_ms: float
    tx_bytes_per_second: tuple[float, ...]
    payload_bytes_per_second: tuple[float, ...]
    tx_packets_per_second: tuple[float, ...]
    init_payload_bytes: tuple[int, ...]
    cycles_per_second: float

    @property
    def payload_bytes_per_cycle(self) -> tuple[float, ...]:
        """TCP payload each rank sends per coordination cycle."""
        return tuple(rate / self.cycles_per_second for rate in self.payload_bytes_per_second)

    @property
    def cycles_on_time_share(self) -> float:
        """Cycles run / cycles HOROVOD_CYCLE_TIME allows (below 1: the loop ran late)."""
        return self.cycles_per_second * self.cycle_time_ms / 1000

    @property
    def mean_tx_bytes_per_second(self) -> float:
        """Frame bytes per second, mean over devices (what a link carries)."""
        return statistics.fmean(self.tx_bytes_per_second)

    @property
    def max_tx_bytes_per_cycle(self) -> float:
        """Frame bytes per cycle of the busiest rank (headers included)."""
        return max(self.tx_bytes_per_second) / self.cycles_per_second

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            **asdict(self),
            "payload_bytes_per_cycle": self.payload_bytes_per_cycle,
            "cycles_on_time_share": self.cycles_on_time_share,
            "mean_tx_bytes_per_second": self.mean_tx_bytes_per_second,
            "max_tx_bytes_per_cycle": self.max_tx_bytes_per_cycle,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IdleCoordination:
        """Inverse of `to_dict`."""
        return cls(
            ranks=int(data["ranks"]),
            cycle_time_ms=float(data["cycle_time_ms"]),
            cycles_per_second=float(data["cycles_per_second"]),
            **{
                name: tuple(data[name])
                for name in (
                    "tx_bytes_per_second",
                    "payload_bytes_per_second",
                    "tx_packets_per_second",
                    "init_payload_bytes",
                )
            },
        )

    @classmethod
    def from_probe_records(cls, records: Sequence[dict[str, Any]]) -> IdleCoordination:
        """Combine the probe's per-rank JSON records of one run."""
        ordered = sorted(records, key=lambda record: record["rank"])
        ranks = {record["ranks"] for record in ordered}
        if len(ranks) != 1 or [r["rank"] for r in ordered] != list(range(ranks.pop())):
            raise ValueError(
                f"probe records do not cover ranks 0..N-1 once: {[r['rank'] for r in ordered]}"
            )
        if "idle_cycles" not in ordered[0]:
            raise ValueError(
                "rank 0's probe counted no cycles: run it with HOROVOD_TIMELINE=DYNAMIC"
            )
        idle = [InterfaceDelta(**record["idle"]) for record in ordered]
        seconds = [record["idle_seconds"] for record in ordered]
        return cls(
            ranks=len(ordered),
            cycle_time_ms=float(ordered[0]["cycle_time_ms"]),
            tx_bytes_per_second=tuple(d.tx_bytes / s for d, s in zip(idle, seconds, strict=True)),
            payload_bytes_per_second=tuple(
                d.payload_bytes / s for d, s in zip(idle, seconds, strict=True)
            ),
            tx_packets_per_second=tuple(
                d.tx_packets / s for d, s in zip(idle, seconds, strict=True)
            ),
            init_payload_bytes=tuple(InterfaceDelta(**r["init"]).payload_bytes for r in ordered),
            cycles_per_second=ordered[0]["idle_cycles"] / seconds[0],
        )


@dataclass(frozen=True)
class Calibration:
    """What the byte accounting cannot derive from a run: launch cost and idle coordination.

    `launch_payload_bytes` is the TCP payload a device sends for a `fleet run` that does
    nothing (horovodrun's ssh sessions); `idle` is measured at the run's device count and cycle.
    """

    launch_payload_bytes: float
    idle: IdleCoordination
    cpu_cores_per_device: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "launch_payload_bytes": self.launch_payload_bytes,
            "cpu_cores_per_device": self.cpu_cores_per_device,
            "idle": self.idle.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        """Inverse of `to_dict`."""
        return cls(
            launch_payload_bytes=float(data["launch_payload_bytes"]),
            idle=IdleCoordination.from_dict(data["idle"]),
            cpu_cores_per_device=data.get("cpu_cores_per_device"),
        )


def probe_argv(
    out_dir: Path, settle_seconds: float, idle_seconds: float, interface: str
) -> list[str]:
    """The worker command line of the probe, as horovodrun runs it on every device."""
    return [
        sys.executable,
        "-m",
        PROBE_MODULE,
        "probe",
        str(out_dir),
        f"{settle_seconds:g}",
        f"{idle_seconds:g}",
        interface,
    ]


def read_probe_records(out_dir: Path) -> list[dict[str, Any]]:
    """Every rank's record the probe left in `out_dir`."""
    return [json.loads(path.read_text()) for path in sorted(Path(out_dir).glob("rank-*.json"))]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the probe on a device."""
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("probe", help="measure this rank's idle coordination")
    command.add_argument("out_dir", type=Path)
    command.add_argument("settle_seconds", type=float)
    command.add_argument("idle_seconds", type=float)
    command.add_argument("interface")
    args = parser.parse_args(argv)
    probe(args.out_dir, args.settle_seconds, args.idle_seconds, args.interface)


if __name__ == "__main__":
    main()
