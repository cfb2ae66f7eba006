"""`globaldl doctor` on the emulated fleet: a healthy device passes, a broken one is named, why."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fleet_support import FleetUnderTest

BIN = Path(sys.executable).parent


def _hold_port(netns: str, address: str, port: int) -> subprocess.Popen[str]:
    """Another process on the device listening on the run's metrics port."""
    holder = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c",
         "import socket, sys, time\n"
         f"s = socket.socket(); s.bind(({address!r}, {port})); s.listen(1)\n"
         "print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.horovod
def test_doctor_names_the_device_with_loopback_hostname_and_taken_port(
    test_fleet: FleetUnderTest, tmp_path: Path
) -> None:
    test_fleet.up("--devices", "2", "--profile", "custom:50:50")
    bad = test_fleet.device(2)
    good_address, bad_address = test_fleet.address(1), test_fleet.address(2)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{good_address} slots=1\n{bad_address} slots=1\n")
    metrics_port = random.randint(20000, 40000)

    # The Raspberry Pi OS trap: the host name on 127.0.1.1, first in /etc/hosts. Written in
    # place: the device sees this file through a bind mount of its inode.
    hosts = Path("/etc/netns") / bad / "hosts"
    hosts.write_text(f"127.0.1.1 {bad}\n" + hosts.read_text())
    holder = _hold_port(bad, bad_address, metrics_port)
    try:
        started = time.monotonic()
        completed = subprocess.run(
            [str(BIN / "globaldl"), "doctor", "--hostfile", str(hostfile),
             "--ssh-identity-file", str(test_fleet.state_dir / "ssh" / "id_ed25519"),
             "--ssh-user", "root", "--metrics-port", str(metrics_port),
             "--measure-seconds", "0.5"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        seconds = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    output = completed.stdout
    assert completed.returncode == 1, output + completed.stderr
    rows = {line.split()[0]: line.split() for line in output.splitlines() if line[:1].isdigit()}
    assert rows[good_address][-1] == "ok", output
    assert rows[bad_address][-1] == "FAIL", output
    assert (
        f"{bad_address}: FAIL hostname: host name {bad} resolves to 127.0.1.1 (loopback)" in output
    )
    assert f"{bad_address}: FAIL ports: metrics port {metrics_port} cannot be bound" in output
    assert output.splitlines()[-1] == f"verdict: a run would FAIL: 1 of 2 devices ({bad_address})"
    # The healthy device's row carries real measurements: versions, Horovod build, the link.
    assert "tf 2.21.0" in " ".join(rows[good_address]) and "gloo+fix" in rows[good_address]
    assert "Mbit/s" in rows[good_address]
    assert seconds < 240
