"""The path a packet takes through the fleet, and what its profiles promise for it.

Endpoints are device names or `host` (the core, where the fleet's host address sits). A packet
from device A to device B crosses A's uplink, then (when A and B are in different sites, or
only one is in a site) the sites' WAN links, then B's downlink; the host sits at the core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from globaldl.fleet.profiles import LinkProfile
from globaldl.fleet.shaping import LinkDirection
from globaldl.fleet.state import FleetState

HOST = "host"
# A probe datagram of 64 payload bytes travels in a 106-byte Ethernet frame (14 + 20 + 8 + 64).
PROBE_PAYLOAD_BYTES = 64
PROBE_FRAME_BYTES = PROBE_PAYLOAD_BYTES + 42


@dataclass(frozen=True)
class FleetPath:
    """The link directions a packet crosses from `source` to `target`, and back."""

    source: str
    target: str
    forward: tuple[LinkDirection, ...]
    backward: tuple[LinkDirection, ...]
    source_address: str
    target_address: str

    def one_way_ms(self, forward: bool = True, frame_bytes: int = PROBE_FRAME_BYTES) -> float:
        """Mean one-way delay of a frame (delays plus serialisation at every shaped hop)."""
        hops = self.forward if forward else self.backward
        return sum(hop.delay_ms + hop.serialisation_ms(frame_bytes) for hop in hops)

    def round_trip_ms(self, frame_bytes: int = PROBE_FRAME_BYTES) -> float:
        """Mean round trip of a frame and its echo of the same size, as the profiles promise."""
        return self.one_way_ms(True, frame_bytes) + self.one_way_ms(False, frame_bytes)

    def loss_fraction(self, forward: bool = True) -> float:
        """Share of packets lost one way: every hop drops independently."""
        hops = self.forward if forward else self.backward
        return 1 - math.prod(1 - hop.loss_percent / 100 for hop in hops)

    @property
    def max_jitter_ms(self) -> float:
        """The largest jitter of any hop, either way."""
        return max((hop.jitter_ms for hop in (*self.forward, *self.backward)), default=0.0)

    @property
    def rate_bits_per_second(self) -> int:
        """The narrowest rate on the forward path (what a bulk transfer can reach)."""
        return min(hop.rate_bits_per_second for hop in self.forward)


def fleet_path(state: FleetState, source: str, target: str) -> FleetPath:
    """The path between two endpoints of the fleet (device names or `host`)."""
    if source == target:
        raise ValueError(f"a path needs two different endpoints, got {source!r} twice")
    up_source, down_source = _to_core(state, source)
    up_target, down_target = _to_core(state, target)
    source_site, target_site = _site_of(state, source), _site_of(state, target)
    if source_site is not None and source_site == target_site:
        # Within one site, traffic turns at the site's bridge: the WAN link is not crossed.
        up_source, down_source = up_source[:1], down_source[-1:]
        up_target, down_target = up_target[:1], down_target[-1:]
    return FleetPath(
        source=source,
        target=target,
        forward=(*up_source, *down_target),
        backward=(*up_target, *down_source),
        source_address=_address(state, source),
        target_address=_address(state, target),
    )


def _site_of(state: FleetState, endpoint: str) -> str | None:
    return None if endpoint == HOST else state.device(endpoint).site


def _address(state: FleetState, endpoint: str) -> str:
    return state.host_address if endpoint == HOST else state.device(endpoint).address


def _to_core(
    state: FleetState, endpoint: str
) -> tuple[tuple[LinkDirection, ...], tuple[LinkDirection, ...]]:
    """(directions from the endpoint to the core, directions from the core to the endpoint)."""
    if endpoint == HOST:
        return (), ()
    device = state.device(endpoint)
    lan = _as_emulated(state, device.profile)
    if device.site is None:
        return (lan.uplink,), (lan.downlink,)
    wan = _as_emulated(state, state.site(device.site).wan)
    return (lan.uplink, wan.uplink), (wan.downlink, lan.downlink)


def _as_emulated(state: FleetState, profile: LinkProfile) -> LinkProfile:
    """What the fleet really applies: without emulation, the rates only."""
    return profile if state.latency_emulated else profile.rates_only()
