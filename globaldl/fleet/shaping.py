"""Shape one direction of a device's link with tc (tbf for rate, netem for latency and loss)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from globaldl.fleet.system import run

ETHERNET_FRAME_BYTES = 1514
# Tokens for 4 ms at the link rate: small enough that the rate holds over any window longer
# than a few milliseconds, never less than two full frames (tbf drops frames above its burst).
BURST_SECONDS = 0.004
MIN_BURST_BYTES = 2 * ETHERNET_FRAME_BYTES + 200
# Cellular modems and home routers buffer generously; 250 ms of queue keeps a bulk TCP flow
# saturating the link (as real links are) instead of losing throughput to tail drops.
QUEUE_SECONDS = 0.25
MIN_QUEUE_BYTES = 64 * 1024
NETEM_HANDLE = "1:"
TBF_UNDER_NETEM_HANDLE = "10:"


@dataclass(frozen=True)
class LinkDirection:
    """What one direction (uplink or downlink) of a device's link should look like."""

    rate_kbit_per_second: float
    one_way_latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0

    @property
    def needs_netem(self) -> bool:
        """True when latency, jitter or loss are asked for."""
        return self.one_way_latency_ms > 0 or self.jitter_ms > 0 or self.loss_percent > 0

    @property
    def rate_bits_per_second(self) -> int:
        """The shaped rate in bit/s, as tc takes it."""
        return round(self.rate_kbit_per_second * 1000)

    @property
    def burst_bytes(self) -> int:
        """Tbf bucket size."""
        return max(MIN_BURST_BYTES, round(self.rate_bits_per_second / 8 * BURST_SECONDS))

    @property
    def queue_bytes(self) -> int:
        """Tbf queue limit."""
        return max(MIN_QUEUE_BYTES, round(self.rate_bits_per_second / 8 * QUEUE_SECONDS))


@dataclass(frozen=True)
class NetemProbe:
    """Whether this kernel has the netem qdisc, and what tc said when it was tried."""

    available: bool
    detail: str


def _tc(netns: str | None) -> list[str]:
    return ["tc", "-n", netns] if netns else ["tc"]


def shaping_commands(
    interface: str, direction: LinkDirection, netns: str | None = None
) -> list[list[str]]:
    """The tc command lines that shape the egress of `interface` (inside `netns` if given).

    Rate only: one root tbf. With latency/jitter/loss: a root netem with the tbf as its child,
    so packets are delayed first and then leave at the link rate.
    """
    tbf = [
        "tbf",
        "rate",
        f"{direction.rate_bits_per_second}bit",
        "burst",
        str(direction.burst_bytes),
        "limit",
        str(direction.queue_bytes),
    ]
    if not direction.needs_netem:
        return [
            [
                *_tc(netns),
                "qdisc",
                "replace",
                "dev",
                interface,
                "root",
                "handle",
                NETEM_HANDLE,
                *tbf,
            ]
        ]
    netem = ["netem"]
    if direction.one_way_latency_ms > 0 or direction.jitter_ms > 0:
        netem += ["delay", f"{direction.one_way_latency_ms:g}ms"]
        if direction.jitter_ms > 0:
            netem.append(f"{direction.jitter_ms:g}ms")
    if direction.loss_percent > 0:
        netem += ["loss", f"{direction.loss_percent:g}%"]
    return [
        [*_tc(netns), "qdisc", "replace", "dev", interface, "root", "handle", NETEM_HANDLE, *netem],
        [
            *_tc(netns),
            "qdisc",
            "replace",
            "dev",
            interface,
            "parent",
            "1:1",
            "handle",
            TBF_UNDER_NETEM_HANDLE,
            *tbf,
        ],
    ]


def apply_shaping(interface: str, direction: LinkDirection, netns: str | None = None) -> None:
    """Shape the egress of `interface`; raises CommandError if tc refuses."""
    for argv in shaping_commands(interface, direction, netns):
        run(argv)


def probe_netem() -> NetemProbe:
    """Try a netem qdisc on the loopback of a throw-away network namespace.

    `unshare --net` gives the probe its own namespace that disappears with the process, so
    nothing on the host is touched and nothing can be left behind.
    """
    completed = run(
        ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        check=False,
    )
    if completed.returncode == 0:
        return NetemProbe(True, "tc qdisc netem works")
    return NetemProbe(False, completed.stderr.strip() or f"tc exited {completed.returncode}")


def read_qdiscs(interface: str, netns: str | None = None) -> list[dict[str, object]]:
    """The live qdiscs on `interface` with their counters, read back from `tc -s -j qdisc show`."""
    completed = run([*_tc(netns), "-s", "-j", "qdisc", "show", "dev", interface])
    qdiscs = []
    for entry in json.loads(completed.stdout or "[]"):
        options = entry.get("options", {})
        qdiscs.append(
            {
                "kind": entry.get("kind"),
                "handle": entry.get("handle"),
                "parent": "root" if entry.get("root") else entry.get("parent"),
                # tc -j reports tbf's rate in bytes per second.
                "rate_bits_per_second": options["rate"] * 8 if "rate" in options else None,
                "delay_ms": _netem_delay_ms(options),
                "loss_percent": _netem_loss_percent(options),
                "sent_bytes": entry.get("bytes", 0),
                "sent_packets": entry.get("packets", 0),
                "dropped_packets": entry.get("drops", 0),
                "overlimits": entry.get("overlimits", 0),
                "backlog_bytes": entry.get("backlog", 0),
            }
        )
    return qdiscs


def _netem_delay_ms(options: dict[str, object]) -> float | None:
    delay = options.get("delay")
    if isinstance(delay, dict) and "delay" in delay:
        return float(delay["delay"]) * 1000  # tc -j reports seconds
    return None


def _netem_loss_percent(options: dict[str, object]) -> float | None:
    loss = options.get("loss-random")
    if isinstance(loss, dict) and "loss" in loss:
        return float(loss["loss"]) * 100  # tc -j reports a fraction
    return None
