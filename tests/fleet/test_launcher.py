"""What `fleet run` tells horovodrun (no root needed)."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from globaldl.fleet import launcher
from globaldl.fleet.profiles import LinkProfile
from globaldl.fleet.state import DeviceState


def _addresses(**interfaces: int) -> dict[str, list[SimpleNamespace]]:
    return {name: [SimpleNamespace(family=family)] for name, family in interfaces.items()}


def test_horovodrun_gets_the_devices_interface_unless_another_is_asked_for(monkeypatch):
    import psutil

    monkeypatch.setattr(
        psutil, "net_if_addrs", lambda: _addresses(lo=socket.AF_INET, eth0=socket.AF_INET)
    )
    # Never left to Horovod's probe, which picks lo or eth0 at random on one device.
    assert launcher.horovod_network_interface(None) == "eth0"
    assert launcher.horovod_network_interface("lo") == "lo"


def test_an_interface_without_an_ipv4_address_on_this_host_is_refused(monkeypatch):
    import psutil

    monkeypatch.setattr(
        psutil, "net_if_addrs", lambda: _addresses(ens3=socket.AF_INET, eth0=socket.AF_INET6)
    )
    with pytest.raises(ValueError, match="no IPv4 address on 'eth0'.*with one: ens3"):
        launcher.horovod_network_interface(None)


def test_horovodrun_checks_ssh_afresh_on_every_run():
    device = DeviceState(
        name="a-1",
        address="10.1.0.2",
        host_interface="a-1-h",
        profile=LinkProfile("p", 1, 1),
        cpu_cores=1,
        memory_bytes=2**30,
        cpu_group="/c",
        memory_group="/m",
        host_key_public="ssh-ed25519 AAAA",
    )
    argv = launcher.horovodrun_argv([device], Path("/k"), ["true"], network_interface="eth0")
    assert "--disable-cache" in argv
    assert argv[argv.index("--network-interface") + 1] == "eth0"
