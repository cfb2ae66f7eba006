"""The site map: which devices share a cheap local network, read from a YAML file.

The file (written by ``globaldl fleet up --sites``, or by hand) is::

    sites:
      berlin: [dev1, dev2, 10.20.0.3]
      lagos: [dev4, dev5]

Each host is a host name or address as it appears in the hostfile. A worker finds its own
site by the first of its names that the map lists: the host name Horovod launched it under
(``HOROVOD_HOSTNAME``, exactly as in the hostfile), then the machine's host names, then its
interface addresses. No TensorFlow here: the file is checked before training starts.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml


class SiteMapError(ValueError):
    """The site map is missing, malformed, or does not list this device; the message says which."""


@dataclass(frozen=True)
class SiteMap:
    """Site name -> the hosts in it, in file order."""

    sites: dict[str, tuple[str, ...]]
    path: Path

    def site_of(self, names: Iterable[str]) -> str:
        """The site of the first of ``names`` the map lists; SiteMapError if none is listed."""
        where = {host: site for site, hosts in self.sites.items() for host in hosts}
        tried = []
        for name in names:
            if name in where:
                return where[name]
            tried.append(name)
        raise SiteMapError(
            f"site map {self.path} lists none of this device's names {tried}; "
            f"its hosts are {sorted(where)}"
        )


def load_site_map(path: Path) -> SiteMap:
    """Read and check a site map; SiteMapError naming the file and the problem otherwise."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise SiteMapError(f"cannot read site map {path}: {error.strerror}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SiteMapError(f"site map {path} is not valid YAML: {error}") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("sites"), dict):
        raise SiteMapError(f"site map {path} must hold `sites: {{SITE: [HOST, ...], ...}}`")
    sites: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for site, hosts in loaded["sites"].items():
        if not isinstance(hosts, list) or not hosts:
            raise SiteMapError(f"site {site!r} in {path} must list at least one host")
        for host in hosts:
            if not isinstance(host, str | int) or isinstance(host, bool) or not str(host):
                raise SiteMapError(f"site {site!r} in {path} lists {host!r}, not a host name")
            if str(host) in seen:
                raise SiteMapError(
                    f"host {host!r} is in two sites of {path}: {seen[str(host)]!r} and {site!r}"
                )
            seen[str(host)] = str(site)
        sites[str(site)] = tuple(str(host) for host in hosts)
    if not sites:
        raise SiteMapError(f"site map {path} lists no sites")
    return SiteMap(sites, path)


def own_names() -> list[str]:
    """The names of the machine this worker runs on, in the order a site map is searched."""
    names = [os.environ.get("HOROVOD_HOSTNAME", ""), socket.gethostname(), socket.getfqdn()]
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            names += [a.address for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
    except OSError:
        pass
    return [name for name in dict.fromkeys(names) if name]
