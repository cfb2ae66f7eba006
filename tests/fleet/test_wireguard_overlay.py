"""Horovod across two fleet devices over a WireGuard overlay, with Gloo held to `wg0`.

This kernel has no WireGuard module, so the overlay runs on wireguard-go, the userspace
implementation (same protocol, same `wg` configuration); real devices use the kernel's.
horovodrun is launched inside device 1's namespace: the launcher must be on the overlay, as the
controller (or the hub) is in the README's set-up, because Gloo's rendezvous and every ring
connection use `--network-interface wg0` addresses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_support import FleetUnderTest

from globaldl.fleet.fleet import read_interface_counters

PROBE = Path(__file__).with_name("horovod_probe.py")
OVERLAY = "10.99.{}.{}"
MTU = 1380
TENSOR_BYTES = 400_000
STEPS = 3

needs_wireguard = pytest.mark.skipif(
    shutil.which("wireguard-go") is None or shutil.which("wg") is None,
    reason="wireguard-go and wireguard-tools are not installed (scripts/setup.sh installs them)",
)


def _key_pair(directory: Path, name: str) -> tuple[Path, str]:
    private = directory / f"{name}.key"
    key = subprocess.run(["wg", "genkey"], capture_output=True, text=True, check=True).stdout
    private.write_text(key)
    private.chmod(0o600)
    public = subprocess.run(
        ["wg", "pubkey"], input=key, capture_output=True, text=True, check=True
    ).stdout.strip()
    return private, public


def _bring_up_wg0(
    netns: str, private_key: Path, overlay_address: str, peer_public: str, peer_endpoint: str
) -> None:
    """wg0 in the device namespace; its control socket in a private /run (none on the host)."""
    script = (
        "set -e; mount -t tmpfs none /run; mkdir /run/wireguard; "
        "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1 wireguard-go wg0 >/dev/null 2>&1; "
        f"wg set wg0 private-key {private_key} listen-port 51820 peer {peer_public} "
        f"endpoint {peer_endpoint}:51820 allowed-ips {overlay_address.rsplit('.', 1)[0]}.0/24 "
        "persistent-keepalive 25; "
        f"ip addr add {overlay_address}/24 dev wg0; ip link set wg0 mtu {MTU} up"
    )
    subprocess.run(
        ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private",
         "sh", "-c", script],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@needs_wireguard
@pytest.mark.horovod
def test_horovod_allreduce_crosses_the_wireguard_overlay(
    test_fleet: FleetUnderTest, tmp_path: Path, venv_bin: Path
) -> None:
    test_fleet.up("--devices", "2", "--profile", "custom:100:100")
    names = [test_fleet.device(1), test_fleet.device(2)]
    addresses = [test_fleet.address(1), test_fleet.address(2)]
    third_octet = int(addresses[0].split(".")[2])
    overlay = [OVERLAY.format(third_octet, 1), OVERLAY.format(third_octet, 2)]
    keys = [_key_pair(tmp_path, name) for name in names]
    for index in (0, 1):
        other = 1 - index
        _bring_up_wg0(
            names[index], keys[index][0], overlay[index], keys[other][1], addresses[other]
        )
    link = json.loads(
        subprocess.run(
            ["ip", "-n", names[1], "-j", "link", "show", "wg0"],
            capture_output=True, text=True, check=True,
        ).stdout
    )[0]  # fmt: skip
    assert link["mtu"] == MTU
    before = read_interface_counters(names[1], "wg0")

    summary = tmp_path / "summary.json"
    identity = test_fleet.state_dir / "ssh" / "id_ed25519"
    completed = subprocess.run(
        ["ip", "netns", "exec", names[0], str(venv_bin / "horovodrun"), "-np", "2",
         "-H", ",".join(f"{address}:1" for address in addresses),
         "--gloo", "--network-interface", "wg0", "--ssh-identity-file", str(identity),
         "--start-timeout", "120",
         sys.executable, str(PROBE), str(summary), str(TENSOR_BYTES), str(STEPS)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    reports = [
        json.loads(line.split("PROBE ", 1)[1])
        for line in completed.stdout.splitlines()
        if "PROBE {" in line
    ]
    assert sorted(report["rank"] for report in reports) == [0, 1]
    assert all(report["sum"] == 3.0 for report in reports)  # ranks add 1 + 2
    after = read_interface_counters(names[1], "wg0")
    # The ring moves about one tensor per step each way; all of it crossed wg0.
    moved = (after["rx_bytes"] - before["rx_bytes"]) + (after["tx_bytes"] - before["tx_bytes"])
    assert moved >= TENSOR_BYTES * STEPS
