"""Access links of the fleet: a device's (or a site's) link to its bridge, shaped and delayed.

Every link has an inner end (a device's `eth0` in its namespace, or a site's uplink port on
the site bridge) and an outer end on a bridge (the core, or the site's LAN). Its uplink rate is
shaped with tc tbf on the inner end's egress, its downlink rate on the outer end's egress.
A link that only shapes rates is a veth pair; one that also delays, jitters or drops packets is
a vde2 chain between two taps (globaldl/fleet/vde.py), recorded in the fleet's journal process
by process so `fleet down` removes exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from globaldl.fleet import vde
from globaldl.fleet.plan import DeviceSpec, FleetPlan, SiteSpec
from globaldl.fleet.profiles import LinkProfile
from globaldl.fleet.shaping import apply_shaping
from globaldl.fleet.state import FleetState
from globaldl.fleet.system import run

DEVICE_INTERFACE = "eth0"


@dataclass(frozen=True)
class LinkSpec:
    """One link to build: its profile and where its two ends go."""

    name: str
    profile: LinkProfile
    inner_interface: str
    outer_interface: str
    outer_bridge: str
    inner_netns: str | None = None
    inner_bridge: str | None = None

    @property
    def staging_interface(self) -> str:
        """The inner end's name while it is still in the host namespace (unique per fleet)."""
        return f"{self.name}-d" if self.inner_netns else self.inner_interface


def device_link(plan: FleetPlan, device: DeviceSpec) -> LinkSpec:
    """A device's access link: `eth0` in its namespace to its site's bridge or the core."""
    return LinkSpec(
        name=device.name,
        profile=device.profile,
        inner_interface=DEVICE_INTERFACE,
        outer_interface=device.host_interface,
        outer_bridge=plan.bridge_of(device),
        inner_netns=device.name,
    )


def site_link(plan: FleetPlan, site: SiteSpec) -> LinkSpec:
    """A site's shared WAN link: from the site bridge to the core bridge."""
    return LinkSpec(
        name=site.bridge,
        profile=site.wan,
        inner_interface=site.uplink_interface,
        outer_interface=site.core_interface,
        outer_bridge=plan.bridge,
        inner_bridge=site.bridge,
    )


def create_link(
    link: LinkSpec, state: FleetState, *, emulate: bool, work_dir: Path, groups: list[str]
) -> str:
    """Build the link, journal what exists as it comes, shape it; return "veth" or "vde".

    `emulate` False shapes the rates only (delay, jitter and loss are then not emulated).
    """
    for name in (link.staging_interface, link.outer_interface):
        if Path(f"/sys/class/net/{name}").exists():
            raise ValueError(
                f"interface {name} already exists; is another fleet using this prefix?"
            )
    profile = link.profile if emulate else link.profile.rates_only()
    if profile.impaired:
        _create_vde_chain(link, state, work_dir / link.name, groups)
        kind = "vde"
    else:
        _create_veth_pair(link, state)
        kind = "veth"
    _place_inner_end(link)
    run(["ip", "link", "set", link.outer_interface, "master", link.outer_bridge, "up"])
    apply_shaping(link.inner_interface, profile.uplink, netns=link.inner_netns)
    apply_shaping(link.outer_interface, profile.downlink)
    return kind


def _create_veth_pair(link: LinkSpec, state: FleetState) -> None:
    argv = ["ip", "link", "add", link.outer_interface, "type", "veth", "peer", "name"]
    if link.inner_netns:
        argv += [link.inner_interface, "netns", link.inner_netns]
    else:
        argv += [link.inner_interface]
    # Journaled first (create_link checked the name is free): a kill meanwhile orphans nothing.
    state.record("link", name=link.outer_interface)
    run(argv)


def _create_vde_chain(
    link: LinkSpec, state: FleetState, directory: Path, groups: list[str]
) -> None:
    """Switch - wirefilter [- switch - wirefilter] - switch, each switch end owning a tap."""
    directory.mkdir(mode=0o700)
    segments = vde.wire_segments(link.profile.uplink, link.profile.downlink)
    sockets = [directory / f"switch-{index}" for index in range(len(segments) + 1)]
    taps = {0: link.staging_interface, len(segments): link.outer_interface}
    for index, socket_dir in enumerate(sockets):
        process = vde.start_switch(
            socket_dir, directory / f"switch-{index}.pid", groups, taps.get(index)
        )
        state.record("process", pid=process.pid, start_ticks=process.start_ticks, link=link.name)
        if index in taps:
            # The switch owns its tap: it disappears when the switch dies.
            state.record("link", name=taps[index])
    for index, segment in enumerate(segments):
        process = vde.start_wirefilter(
            segment, sockets[index], sockets[index + 1], directory / f"wire-{index}.pid", groups
        )
        state.record("process", pid=process.pid, start_ticks=process.start_ticks, link=link.name)


def _place_inner_end(link: LinkSpec) -> None:
    if link.inner_netns:
        staged = link.staging_interface
        if staged != link.inner_interface and Path(f"/sys/class/net/{staged}").exists():
            # A tap made in the host namespace moves into the device's and takes its final name.
            run(["ip", "link", "set", staged, "netns", link.inner_netns])
            run(["ip", "-n", link.inner_netns, "link", "set", staged, "name", link.inner_interface])
        run(["ip", "-n", link.inner_netns, "link", "set", link.inner_interface, "up"])
    else:
        run(["ip", "link", "set", link.inner_interface, "master", str(link.inner_bridge), "up"])
