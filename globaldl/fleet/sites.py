"""Sites: devices grouped behind one shared wide-area link each, and the site map they leave.

Real IoT devices sit behind gateways: the cameras of one building share a LAN and one uplink.
`globaldl fleet up --sites 4x4 --lan lan --wan lte` (or `--sites FILE.yaml`) puts each site's
devices on their own bridge (the site LAN, links shaped to the LAN profile) and joins every site
to the core through one link shaped to the WAN profile, shared by all devices of the site.

A site file (input) names each site and its device count, optionally its own LAN and WAN:

    sites:
      berlin: 4                                  # 4 devices, the --lan and --wan profiles
      nairobi: {devices: 4, wan: geo-satellite}  # its own WAN profile

The site map (output, the contract with `globaldl train --sites-file`) lists each site's hosts
as the host file names them (their addresses):

    sites:
      berlin: [10.77.0.2, 10.77.0.3]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from globaldl.files import write_text_atomically
from globaldl.fleet.profiles import LinkProfile, resolve_profile

SITE_MAP_FILE_NAME = "sites.yaml"
MAX_SITES = 99
DEFAULT_LAN_PROFILE = "lan"
_GRID = re.compile(r"^(\d+)x(\d+)$")
_SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_SITE_KEYS = ("devices", "lan", "wan")


@dataclass(frozen=True)
class SiteLayout:
    """One site as asked for: its name, how many devices, their LAN and the site's WAN link."""

    name: str
    devices: int
    lan: LinkProfile
    wan: LinkProfile

    def __post_init__(self) -> None:
        if not _SITE_NAME.match(self.name):
            raise ValueError(
                f"site name {self.name!r} must be 1-32 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        if isinstance(self.devices, bool) or not isinstance(self.devices, int):
            raise ValueError(f"site {self.name!r}: devices must be a whole number")
        if self.devices < 1:
            raise ValueError(f"site {self.name!r}: devices must be at least 1, got {self.devices}")


def grid_shape(spec: str) -> tuple[int, int] | None:
    """`SITESxDEVICES` (e.g. "4x4") as (sites, devices per site); None for a site file."""
    grid = _GRID.match(spec.strip())
    return (int(grid[1]), int(grid[2])) if grid is not None else None


def parse_sites(
    spec: str, profiles: dict[str, LinkProfile], lan: str, wan: str | None
) -> list[SiteLayout]:
    """`SITESxDEVICES` (e.g. 4x4) or the path of a site file, into site layouts.

    `lan` and `wan` are profile specs (names or custom:...) used where the file gives none;
    the WAN is required.
    """
    grid = grid_shape(spec)
    if grid is not None:
        count, per_site = grid
        if wan is None:
            raise ValueError(f"--sites {spec} needs --wan PROFILE (the link each site shares)")
        lan_profile, wan_profile = (resolve_profile(p, profiles) for p in (lan, wan))
        layouts = [
            SiteLayout(f"site-{index}", per_site, lan_profile, wan_profile)
            for index in range(1, count + 1)
        ]
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(
                f"--sites {spec!r} is neither SITESxDEVICES (e.g. 4x4) nor a site file that exists"
            )
        layouts = _read_site_file(path, profiles, lan, wan)
    if not 1 <= len(layouts) <= MAX_SITES:
        raise ValueError(f"--sites {spec}: between 1 and {MAX_SITES} sites, got {len(layouts)}")
    return layouts


def _read_site_file(
    path: Path, profiles: dict[str, LinkProfile], lan: str, wan: str | None
) -> list[SiteLayout]:
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("sites"), dict):
        raise ValueError(f"{path}: expected a mapping with a 'sites' mapping of NAME: DEVICES")
    layouts = []
    for name, entry in document["sites"].items():
        fields: dict[str, Any] = {"devices": entry} if not isinstance(entry, dict) else entry
        unknown = sorted(str(key) for key in set(fields) - set(_SITE_KEYS))
        if unknown:
            raise ValueError(
                f"{path}: site {name!r} has unknown keys {unknown}; allowed: {list(_SITE_KEYS)}"
            )
        site_wan = fields.get("wan", wan)
        if site_wan is None:
            raise ValueError(f"{path}: site {name!r} has no wan profile and --wan is not given")
        try:
            layouts.append(
                SiteLayout(
                    str(name),
                    fields.get("devices"),  # type: ignore[arg-type]
                    resolve_profile(str(fields.get("lan", lan)), profiles),
                    resolve_profile(str(site_wan), profiles),
                )
            )
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    return layouts


def site_map_text(sites: dict[str, list[str]]) -> str:
    """The site map document: `sites: {SITE: [HOST, ...]}`, with a header saying what it is."""
    return "# globaldl site map: the hosts (as in the host file) of each site.\n" + yaml.safe_dump(
        {"sites": sites}, sort_keys=False, default_flow_style=None
    )


def write_site_map(path: Path, sites: dict[str, list[str]]) -> None:
    """Write the site map atomically."""
    write_text_atomically(Path(path), site_map_text(sites))


def read_site_map(path: Path) -> dict[str, list[str]]:
    """Read a site map; ValueError naming the file when it is not `sites: {NAME: [HOST...]}`."""
    document = yaml.safe_load(Path(path).read_text())
    sites = document.get("sites") if isinstance(document, dict) else None
    if not isinstance(sites, dict) or not all(
        isinstance(hosts, list) and all(isinstance(host, str) for host in hosts)
        for hosts in sites.values()
    ):
        raise ValueError(f"{path}: expected `sites: {{SITE_NAME: [HOST, ...], ...}}`")
    return {str(name): list(hosts) for name, hosts in sites.items()}
