"""Check a run's gradient byte count against what the devices' interfaces actually carried."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceBytes:
    """Bytes one device's eth0 sent (uplink) and received (downlink) during a run."""

    device: str
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int


@dataclass(frozen=True)
class ByteAccounting:
    """Interface counters of every device next to the run summary's `gradient_bytes_wire`.

    `gradient_bytes_wire` is what ONE rank handed to Horovod collectives. A ring allreduce
    makes each rank send 2(N-1)/N times that, a ring allgather N-1 times (both 1 for N = 2);
    on top come Ethernet/IP/TCP headers (~4.5% at MTU 1500), the initial weight broadcast,
    the worker's log lines carried back over ssh, and Horovod's coordination: every cycle
    (HOROVOD_CYCLE_TIME, 1 ms by default) the ranks exchange a few small messages, measured
    here at ~240 KB/s per device in each direction even when no tensor is ready. That part
    grows with wall time, not with gradient bytes: `extra_tx_bytes_per_second` shows it.
    """

    devices: tuple[DeviceBytes, ...]
    gradient_bytes_wire: int
    ranks: int
    steps: int
    run_seconds: float | None = None

    @property
    def mean_tx_bytes(self) -> float:
        """Mean uplink bytes per device."""
        return sum(device.tx_bytes for device in self.devices) / len(self.devices)

    @property
    def allreduce_factor(self) -> float:
        """Bytes a rank sends per byte it hands to a ring allreduce: 2(N-1)/N."""
        return 2 * (self.ranks - 1) / self.ranks

    @property
    def tx_to_wire_ratio(self) -> float | None:
        """Mean device uplink bytes / gradient_bytes_wire (None if nothing was sent)."""
        return self.mean_tx_bytes / self.gradient_bytes_wire if self.gradient_bytes_wire else None

    @property
    def overhead_ratio(self) -> float | None:
        """tx_to_wire_ratio / allreduce_factor: 1.0 would mean no protocol overhead at all."""
        ratio = self.tx_to_wire_ratio
        return (
            ratio / self.allreduce_factor if ratio is not None and self.allreduce_factor else None
        )

    @property
    def extra_tx_bytes(self) -> float:
        """Mean uplink bytes beyond what the ring allreduce of the gradients needs."""
        return self.mean_tx_bytes - self.gradient_bytes_wire * self.allreduce_factor

    @property
    def extra_tx_bytes_per_second(self) -> float | None:
        """`extra_tx_bytes` spread over the run: the rate of everything that is not gradients."""
        return self.extra_tx_bytes / self.run_seconds if self.run_seconds else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, derived ratios included."""
        return {
            "devices": [vars(device) for device in self.devices],
            "gradient_bytes_wire": self.gradient_bytes_wire,
            "ranks": self.ranks,
            "steps": self.steps,
            "mean_tx_bytes": self.mean_tx_bytes,
            "allreduce_factor": self.allreduce_factor,
            "tx_to_wire_ratio": self.tx_to_wire_ratio,
            "overhead_ratio": self.overhead_ratio,
            "run_seconds": self.run_seconds,
            "extra_tx_bytes": self.extra_tx_bytes,
            "extra_tx_bytes_per_second": self.extra_tx_bytes_per_second,
        }

    def report(self) -> str:
        """A few lines for the terminal."""
        lines = [
            "byte accounting: device interface counters vs the run summary",
            f"  {'device':<12} {'tx_bytes':>14} {'rx_bytes':>14} {'tx/wire':>8}",
        ]
        for device in self.devices:
            ratio = (
                f"{device.tx_bytes / self.gradient_bytes_wire:8.3f}"
                if self.gradient_bytes_wire
                else "     n/a"
            )
            lines.append(
                f"  {device.device:<12} {device.tx_bytes:>14,} {device.rx_bytes:>14,} {ratio}"
            )
        lines.append(
            f"  gradient_bytes_wire (one rank) {self.gradient_bytes_wire:,} over {self.steps} "
            f"steps, {self.ranks} ranks"
        )
        if self.tx_to_wire_ratio is not None and self.overhead_ratio is not None:
            lines.append(
                f"  mean tx / gradient_bytes_wire = {self.tx_to_wire_ratio:.3f} (ring allreduce "
                f"alone: {self.allreduce_factor:.3f}; the rest is protocol overhead: "
                f"x{self.overhead_ratio:.3f})"
            )
        if self.extra_tx_bytes_per_second is not None:
            lines.append(
                f"  beyond the gradients: {self.extra_tx_bytes:,.0f} B per device, "
                f"{self.extra_tx_bytes_per_second / 1000:.1f} kB/s over {self.run_seconds:.1f} s "
                "(headers, Horovod coordination, broadcast, logs)"
            )
        return "\n".join(lines)


def account_bytes(
    before: dict[str, dict[str, int]],
    after: dict[str, dict[str, int]],
    summary: dict[str, Any],
    run_seconds: float | None = None,
) -> ByteAccounting:
    """Per-device counter deltas (`before`/`after`: device -> counters) next to the summary."""
    missing = sorted(set(before) ^ set(after))
    if missing:
        raise ValueError(f"counters before and after the run cover different devices: {missing}")
    for field in ("gradient_bytes_wire", "steps", "ranks"):
        if field not in summary:
            raise ValueError(f"run summary lacks {field!r}; fields present: {sorted(summary)}")
    devices = tuple(
        DeviceBytes(
            device=name,
            tx_bytes=after[name]["tx_bytes"] - before[name]["tx_bytes"],
            rx_bytes=after[name]["rx_bytes"] - before[name]["rx_bytes"],
            tx_packets=after[name]["tx_packets"] - before[name]["tx_packets"],
            rx_packets=after[name]["rx_packets"] - before[name]["rx_packets"],
        )
        for name in sorted(before)
    )
    return ByteAccounting(
        devices=devices,
        gradient_bytes_wire=int(summary["gradient_bytes_wire"]),
        ranks=int(summary["ranks"]),
        steps=int(summary["steps"]),
        run_seconds=run_seconds,
    )
