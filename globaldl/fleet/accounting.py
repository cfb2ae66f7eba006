"""Check a run's byte counts against what the devices' interfaces carried, byte by byte.

Each device's uplink counter (`tx_bytes` of its eth0) is the truth. It is split into what is
known exactly and what is modelled:

* headers: 66 bytes (Ethernet, IPv4, TCP with timestamps) per packet, from the packet counter;
* the step's gradients: `gradient_bytes_wire` (what one rank handed to Horovod) passed through
  the collective's algorithm (globaldl/collectives.py: ring allreduce 2(N-1)/N, ring allgather
  N-1), plus Gloo's framing per message;
* every other collective the run called (initial broadcast, validation sums, digest gathers),
  from the summary's ledger, the same way;
* the worker's log lines carried back to horovodrun over ssh (counted by the launcher);
* with a calibration (`globaldl bench coordination`): the ssh sessions of the launch,
  Horovod's init, and its idle coordination per second at the run's cycle time.

What remains is reported as `unexplained_tx_bytes`. Without a calibration, everything beyond the
run's own data is reported as `coordination_payload_bytes`: coordination, ssh and init together.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from globaldl.collectives import RunCollectives
from globaldl.fleet.coordination import HEADER_BYTES_PER_PACKET, Calibration

COUNTER_FIELDS = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
# Counted when the launcher read them (older accountings have only the interface counters).
TCP_COUNTER_FIELDS = ("tcp_out_segments", "tcp_retransmitted_segments")
# The largest TCP payload of a segment at MTU 1500 with timestamps: a retransmitted segment
# resends at most this much.
MAX_SEGMENT_PAYLOAD_BYTES = 1448


@dataclass(frozen=True)
class DeviceBytes:
    """Bytes one device's eth0 sent (uplink) and received (downlink) during a run."""

    device: str
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int
    tcp_out_segments: int | None = None
    tcp_retransmitted_segments: int | None = None

    @property
    def retransmitted_payload_bytes(self) -> float:
        """Payload sent a second time, estimated: retransmitted segments x mean segment payload.

        Linux counts segments, not bytes. Most retransmissions here are tail-loss probes and
        timeouts of small coordination messages delayed on a busy machine, so the run's mean
        payload per segment is the estimate, not a full segment (at most 1448 bytes each).
        """
        if not self.tcp_retransmitted_segments or not self.tcp_out_segments:
            return 0.0
        per_segment = self.payload_tx_bytes / self.tcp_out_segments
        return self.tcp_retransmitted_segments * min(per_segment, MAX_SEGMENT_PAYLOAD_BYTES)

    @property
    def header_tx_bytes(self) -> int:
        """Ethernet/IP/TCP headers of every packet sent."""
        return HEADER_BYTES_PER_PACKET * self.tx_packets

    @property
    def payload_tx_bytes(self) -> int:
        """TCP payload sent: the uplink counter without the headers."""
        return self.tx_bytes - self.header_tx_bytes


@dataclass(frozen=True)
class DeviceAccount:
    """One device: its measured uplink bytes next to each modelled part (TCP payload bytes)."""

    device: str
    rank: int | None
    measured: DeviceBytes
    gradient_tx_bytes: float
    collectives_tx_bytes: float
    log_tx_bytes: float
    launch_tx_bytes: float | None = None
    init_tx_bytes: float | None = None
    coordination_tx_bytes_model: float | None = None

    @property
    def known_payload_tx_bytes(self) -> float:
        """Payload of the run's own data (gradients, other collectives, log lines) and resends."""
        return (
            self.gradient_tx_bytes
            + self.collectives_tx_bytes
            + self.log_tx_bytes
            + self.measured.retransmitted_payload_bytes
        )

    @property
    def coordination_payload_bytes(self) -> float:
        """Measured payload beyond the run's own data (and beyond launch and init, if known)."""
        fixed = (self.launch_tx_bytes or 0.0) + (self.init_tx_bytes or 0.0)
        return self.measured.payload_tx_bytes - self.known_payload_tx_bytes - fixed

    @property
    def model_tx_bytes(self) -> float | None:
        """Headers + every modelled part; None without a calibration."""
        parts = (self.launch_tx_bytes, self.init_tx_bytes, self.coordination_tx_bytes_model)
        if any(part is None for part in parts):
            return None
        return (
            self.measured.header_tx_bytes
            + self.known_payload_tx_bytes
            + sum(part for part in parts if part is not None)
        )

    @property
    def unexplained_tx_bytes(self) -> float | None:
        """Measured tx bytes minus the model (None without a calibration)."""
        model = self.model_tx_bytes
        return None if model is None else self.measured.tx_bytes - model

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the counters, each part, and what is left."""
        return {
            **asdict(self.measured),
            "rank": self.rank,
            "header_tx_bytes": self.measured.header_tx_bytes,
            "retransmitted_payload_bytes": self.measured.retransmitted_payload_bytes,
            "payload_tx_bytes": self.measured.payload_tx_bytes,
            "gradient_tx_bytes": self.gradient_tx_bytes,
            "collectives_tx_bytes": self.collectives_tx_bytes,
            "log_tx_bytes": self.log_tx_bytes,
            "launch_tx_bytes": self.launch_tx_bytes,
            "init_tx_bytes": self.init_tx_bytes,
            "coordination_payload_bytes": self.coordination_payload_bytes,
            "coordination_tx_bytes_model": self.coordination_tx_bytes_model,
            "model_tx_bytes": self.model_tx_bytes,
            "unexplained_tx_bytes": self.unexplained_tx_bytes,
        }


@dataclass(frozen=True)
class ByteAccounting:
    """Every device's interface counters next to the run summary, with the model's parts.

    `gradient_bytes_wire` is what ONE rank handed to Horovod for gradients; a device sends
    `tx_bytes_per_wire_byte` times that (N-1 for the allgather of compressed payloads,
    2(N-1)/N for the ring allreduce of dense ones), plus everything else listed above.
    """

    run: RunCollectives
    devices: tuple[DeviceAccount, ...]
    run_seconds: float | None = None
    coordination_seconds: float | None = None
    cycle_time_ms: float | None = None
    calibration: Calibration | None = None
    coordination_cycles: int | None = None
    round_trip_seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def mean_tx_bytes(self) -> float:
        """Mean uplink bytes per device: what a device's link really carried."""
        return statistics.fmean(account.measured.tx_bytes for account in self.devices)

    @property
    def device_tx_bytes_per_step(self) -> float | None:
        """Mean uplink bytes per device per step, everything included (None without steps)."""
        return self.mean_tx_bytes / self.run.steps if self.run.steps > 0 else None

    @property
    def tx_to_wire_ratio(self) -> float | None:
        """Mean device uplink bytes / gradient_bytes_wire (None if nothing was sent)."""
        wire = self.run.gradient_bytes_wire
        return self.mean_tx_bytes / wire if wire else None

    @property
    def coordination_payload_bytes_per_second(self) -> float | None:
        """Mean payload per second beyond the run's own data: Horovod's coordination."""
        if not self.coordination_seconds:
            return None
        mean = statistics.fmean(a.coordination_payload_bytes for a in self.devices)
        return mean / self.coordination_seconds

    @property
    def unexplained_tx_bytes(self) -> float | None:
        """Mean over devices of measured minus modelled tx bytes (None without calibration)."""
        values = [account.unexplained_tx_bytes for account in self.devices]
        if any(value is None for value in values):
            return None
        return statistics.fmean(value for value in values if value is not None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, derived figures included."""
        return {
            "devices": [account.to_dict() for account in self.devices],
            "gradient_bytes_wire": self.run.gradient_bytes_wire,
            "ranks": self.run.ranks,
            "steps": self.run.steps,
            "combine": self.run.combine,
            "tx_bytes_per_wire_byte": self.run.tx_bytes_per_wire_byte,
            "mean_tx_bytes": self.mean_tx_bytes,
            "device_tx_bytes_per_step": self.device_tx_bytes_per_step,
            "tx_to_wire_ratio": self.tx_to_wire_ratio,
            "run_seconds": self.run_seconds,
            "coordination_seconds": self.coordination_seconds,
            "horovod_cycle_time_ms": self.cycle_time_ms,
            "coordination_cycles": self.coordination_cycles,
            "round_trip_seconds": self.round_trip_seconds,
            "coordination_payload_bytes_per_second": self.coordination_payload_bytes_per_second,
            "unexplained_tx_bytes": self.unexplained_tx_bytes,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "notes": list(self.notes),
        }

    def report(self) -> str:
        """A few lines for the terminal: per device, measured tx and where it went."""
        run = self.run
        lines = [
            "byte accounting: device uplink counters against the run summary (bytes)",
            f"  {'device':<10} {'tx':>12} {'headers':>10} {'gradients':>11} {'other coll.':>11} "
            f"{'logs':>8} {'resent':>8} {'beyond':>10} {'unexplained':>12}",
        ]
        for account in self.devices:
            unexplained = account.unexplained_tx_bytes
            lines.append(
                f"  {account.device:<10} {account.measured.tx_bytes:>12,} "
                f"{account.measured.header_tx_bytes:>10,} {account.gradient_tx_bytes:>11,.0f} "
                f"{account.collectives_tx_bytes:>11,.0f} {account.log_tx_bytes:>8,.0f} "
                f"{account.measured.retransmitted_payload_bytes:>8,.0f} "
                f"{account.coordination_payload_bytes:>10,.0f} "
                + (f"{unexplained:>12,.0f}" if unexplained is not None else f"{'n/a':>12}")
            )
        lines.append(
            f"  gradient_bytes_wire (one rank) {run.gradient_bytes_wire:,} over {run.steps} steps, "
            f"{run.ranks} ranks, combine {run.combine}: each device sends "
            f"{run.tx_bytes_per_wire_byte:g}x that ("
            + ("ring allgather, N-1" if run.combine == "gather" else "ring allreduce, 2(N-1)/N")
            + ")"
        )
        lines.append(
            "  (headers: 66 B per packet; resent: TCP retransmissions, estimated; beyond: "
            "payload beyond the run's own data"
            + (", minus the calibrated launch and init" if self.calibration else "")
            + "; unexplained: tx minus every modelled part)"
        )
        per_step = self.device_tx_bytes_per_step
        if per_step is not None:
            lines.append(
                f"  per-device traffic measured: {per_step:,.0f} B per step (mean over devices, "
                "everything the interface sent over the run)"
            )
        rate = self.coordination_payload_bytes_per_second
        if rate is not None:
            lines.append(
                f"  beyond the run's own data: {rate / 1000:.1f} kB/s payload per device over "
                f"{self.coordination_seconds:.1f} s of Horovod (coordination"
                + (")" if self.calibration else ", ssh sessions, init)")
            )
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def account_bytes(
    before: Mapping[str, Mapping[str, int]],
    after: Mapping[str, Mapping[str, int]],
    summary: Mapping[str, Any],
    run_seconds: float | None = None,
    *,
    log_bytes_by_rank: Mapping[int, int] | None = None,
    summary_written_unix_seconds: float | None = None,
    cycle_time_ms: float | None = None,
    calibration: Calibration | None = None,
    coordination_cycles: int | None = None,
    round_trip_seconds: float = 0.0,
) -> ByteAccounting:
    """Per-device counter deltas (`before`/`after`: device -> counters) against the model.

    `log_bytes_by_rank`: bytes of each rank's output lines (they cross the device's uplink
    inside its ssh session). `summary_written_unix_seconds` closes the span over which Horovod
    coordinated (it opened at the summary's `horovod_started_unix_seconds`).
    `coordination_cycles`: Horovod's cycles in the run, when counted (rank 0's timeline with
    HOROVOD_TIMELINE_MARK_CYCLES); the calibration's bytes per cycle then model coordination
    exactly. Otherwise its bytes per idle second do, which overstates it when the loop ran
    late (a busy device runs fewer cycles). `round_trip_seconds`: the fleet's worst device
    round trip. Every cycle's requests go to the coordinator and its answer comes back, so a
    cycle takes at least one round trip: where that is longer than the calibrated cycle (which
    was measured on links without delay), the cycles counted per second are at most one per
    round trip.
    """
    if not round_trip_seconds >= 0:
        raise ValueError(f"round_trip_seconds must be >= 0, got {round_trip_seconds!r}")
    missing = sorted(set(before) ^ set(after))
    if missing:
        raise ValueError(f"counters before and after the run cover different devices: {missing}")
    run = RunCollectives.from_summary(summary)
    notes = []
    coordination_seconds = None
    if run.horovod_started_unix_seconds is not None and summary_written_unix_seconds is not None:
        coordination_seconds = max(
            0.0, summary_written_unix_seconds - run.horovod_started_unix_seconds
        )
    if calibration is not None and (
        calibration.idle.ranks != run.ranks
        or cycle_time_ms is None
        or calibration.idle.cycle_time_ms != cycle_time_ms
    ):
        notes.append(
            f"calibration measured on {calibration.idle.ranks} devices at "
            f"{calibration.idle.cycle_time_ms:g} ms does not match this run ({run.ranks} ranks, "
            f"cycle {cycle_time_ms} ms): not used"
        )
        calibration = None
    if run.collectives_outside_steps == () and "traffic" not in summary:
        notes.append("summary has no collective ledger: broadcasts and reductions not modelled")
    logs = dict(log_bytes_by_rank or {})
    accounts = []
    for name in sorted(before):
        measured = DeviceBytes(
            device=name,
            **{key: after[name][key] - before[name][key] for key in COUNTER_FIELDS},
            **{
                key: after[name][key] - before[name][key]
                for key in TCP_COUNTER_FIELDS
                if key in before[name] and key in after[name]
            },
        )
        # A summary without device names leaves the rank unknown: the mean over ranks then.
        rank = run.rank_of(name)
        if rank is None:
            log_bytes = statistics.fmean(logs.values()) if logs else 0.0
        else:
            log_bytes = float(logs.get(rank, 0))
        extra: dict[str, float | None] = {}
        if calibration is not None:
            idle = calibration.idle

            def of_rank(values: tuple[float, ...], rank: int | None = rank) -> float:
                return float(values[rank]) if rank is not None else statistics.fmean(values)

            coordination = None
            if coordination_cycles is not None:
                coordination = of_rank(idle.payload_bytes_per_cycle) * coordination_cycles
            elif coordination_seconds is not None:
                # The share of the calibrated cycles a round trip per cycle still allows.
                on_time = min(1.0, 1.0 / (round_trip_seconds * idle.cycles_per_second or 1.0))
                coordination = (
                    of_rank(idle.payload_bytes_per_second) * coordination_seconds * on_time
                )
            extra = {
                "launch_tx_bytes": calibration.launch_payload_bytes,
                "init_tx_bytes": of_rank(tuple(map(float, idle.init_payload_bytes))),
                "coordination_tx_bytes_model": coordination,
            }
        accounts.append(
            DeviceAccount(
                device=name,
                rank=rank,
                measured=measured,
                gradient_tx_bytes=run.tx_bytes(run.gradient_traffic, rank),
                collectives_tx_bytes=run.tx_bytes(run.other_traffic, rank),
                log_tx_bytes=log_bytes,
                **extra,
            )
        )
    return ByteAccounting(
        run=run,
        devices=tuple(accounts),
        run_seconds=run_seconds,
        coordination_seconds=coordination_seconds,
        cycle_time_ms=cycle_time_ms,
        calibration=calibration,
        coordination_cycles=coordination_cycles,
        round_trip_seconds=round_trip_seconds,
        notes=tuple(notes),
    )
