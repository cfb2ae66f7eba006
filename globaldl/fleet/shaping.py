"""Shape the rate of one direction of a link with tc tbf, and read the qdiscs back.

This kernel has no netem; delay, jitter and loss are added in user space (globaldl/fleet/vde.py),
and tbf still shapes the rate on the link's interfaces (veth or tap alike).
"""

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
ROOT_HANDLE = "1:"


@dataclass(frozen=True)
class LinkDirection:
    """One direction (uplink or downlink) of a link: rate, one-way delay, jitter, loss."""

    rate_kbit_per_second: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0

    @property
    def impaired(self) -> bool:
        """True when delay, jitter or loss are asked for (not just a rate)."""
        return self.delay_ms > 0 or self.jitter_ms > 0 or self.loss_percent > 0

    @property
    def rate_bits_per_second(self) -> int:
        """The shaped rate in bit/s, as tc takes it."""
        return round(self.rate_kbit_per_second * 1000)

    def serialisation_ms(self, frame_bytes: int) -> float:
        """Time one frame of `frame_bytes` takes at this rate."""
        return frame_bytes * 8 / self.rate_bits_per_second * 1000

    @property
    def burst_bytes(self) -> int:
        """Tbf bucket size."""
        return max(MIN_BURST_BYTES, round(self.rate_bits_per_second / 8 * BURST_SECONDS))

    @property
    def queue_bytes(self) -> int:
        """Tbf queue limit."""
        return max(MIN_QUEUE_BYTES, round(self.rate_bits_per_second / 8 * QUEUE_SECONDS))


def _tc(netns: str | None) -> list[str]:
    return ["tc", "-n", netns] if netns else ["tc"]


def shaping_command(
    interface: str, direction: LinkDirection, netns: str | None = None
) -> list[str]:
    """The tc command line that shapes the egress of `interface` (inside `netns` if given)."""
    return [
        *_tc(netns),
        "qdisc",
        "replace",
        "dev",
        interface,
        "root",
        "handle",
        ROOT_HANDLE,
        "tbf",
        "rate",
        f"{direction.rate_bits_per_second}bit",
        "burst",
        str(direction.burst_bytes),
        "limit",
        str(direction.queue_bytes),
    ]


def apply_shaping(interface: str, direction: LinkDirection, netns: str | None = None) -> None:
    """Shape the egress of `interface` to the direction's rate; CommandError if tc refuses."""
    run(shaping_command(interface, direction, netns))


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
                "sent_bytes": entry.get("bytes", 0),
                "sent_packets": entry.get("packets", 0),
                "dropped_packets": entry.get("drops", 0),
                "overlimits": entry.get("overlimits", 0),
                "backlog_bytes": entry.get("backlog", 0),
            }
        )
    return qdiscs
