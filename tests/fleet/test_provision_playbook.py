"""deploy/ansible provisions a 2-device emulated fleet over ssh, and a second run changes nothing.

Each emulated device is a network namespace with its own sshd, reached by Ansible as a real
device is; the devices share this machine's filesystem, so each installs below its own prefix.
What cannot run here: arm64 devices (same playbook paths, other wheels; see the README), and the
Horovod build on a device (minutes; the controller's own patched wheel is reused, as the playbook
does whenever the controller matches the platform). Debian packages are all present on this
machine, so installing them is proven in check mode, which resolves them without installing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from fleet_support import FleetUnderTest
from horovod.runner.common.util.hosts import parse_host_files

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "deploy" / "ansible"
BIN = Path(sys.executable).parent
PLAYBOOK_TIMEOUT_SECONDS = 1200
# A fat link: the wheelhouse archive (~750 MB) crosses each device's shaped downlink.
PROFILE = "custom:2000:2000"


def _playbook(
    inventory: Path, out: Path, public_key: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "site.yml",
            "-e",
            f"globaldl_output_dir={out}",
            "-e",
            f"globaldl_ssh_public_key_file={public_key}",
            *extra,
        ],  # fmt: skip
        cwd=ANSIBLE,
        env={**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=PLAYBOOK_TIMEOUT_SECONDS,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-3000:]
    return completed


def _recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counts per host: {'dev-1': {'ok': 30, 'changed': 0, ...}}."""
    recap = {}
    for line in output.split("PLAY RECAP", 1)[1].splitlines()[1:]:
        match = re.match(r"^(\S+)\s+:\s+(.*)$", line.strip())
        if match:
            recap[match[1]] = {
                key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match[2])
            }
    return recap


def _task_results(output: str, task: str) -> list[str]:
    """The result lines (`ok: [host]`, `changed: ...`, `skipping: ...`) under one task."""
    block = output.split(f"TASK [globaldl_device : {task}]", 1)[1].split("TASK [", 1)[0]
    return [line for line in block.splitlines() if re.match(r"^(ok|changed|skipping|fatal)", line)]


@pytest.mark.horovod
# Three playbook runs against fresh prefixes: minutes on a machine at load 20 (the suite's
# 900 s default was hit there); far less on a quiet one.
@pytest.mark.timeout(2400)
def test_playbook_provisions_the_fleet_and_a_second_run_changes_nothing(
    test_fleet: FleetUnderTest, tmp_path: Path
) -> None:
    test_fleet.up("--devices", "2", "--profile", PROFILE)
    names = [test_fleet.device(1), test_fleet.device(2)]
    addresses = [test_fleet.address(1), test_fleet.address(2)]
    # Below /var/tmp: on the same filesystem as uv's cache, which links files instead of copying.
    prefix_root = Path("/var/tmp") / f"gdl-provision-{test_fleet.prefix}"
    out, inventory, key = tmp_path / "out", tmp_path / "inventory.yml", tmp_path / "horovodrun_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    subprocess.run(
        [str(BIN / "globaldl"), "provision", "inventory", "--out", str(inventory),
         "--prefix-root", str(prefix_root), "--state-dir", str(test_fleet.state_dir)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    try:
        first = _playbook(inventory, out, Path(f"{key}.pub"))
        recap = _recap(first.stdout)
        assert all(recap[name]["changed"] > 0 and recap[name]["failed"] == 0 for name in names)

        second = _playbook(inventory, out, Path(f"{key}.pub"))
        recap = _recap(second.stdout)
        assert {host: counts["changed"] for host, counts in recap.items()} == dict.fromkeys(
            [*names, "localhost"], 0
        ), second.stdout[-4000:]
        # The package step ran (and found everything installed) both times.
        assert sorted(_task_results(second.stdout, "Installed packages")) == [
            f"ok: [{name}]" for name in names
        ]

        # Installing a missing package: check mode resolves it and would change the device.
        check = _playbook(
            inventory, out, Path(f"{key}.pub"), "--check", "--tags", "packages",
            "-e", '{"globaldl_packages": ["python3", "wireguard-tools", "sl"]}',
        )  # fmt: skip
        assert sorted(_task_results(check.stdout, "Install the missing packages")) == sorted(
            f"changed: [{name}]" for name in names
        )

        for name, address in zip(names, addresses, strict=True):
            venv = prefix_root / name / "venv"
            versions = subprocess.run(
                [str(venv / "bin" / "python"), "-c",
                 "import importlib.metadata as m, horovod.globaldl_patches as p;"
                 "print(m.version('tensorflow'), m.version('horovod'), *p.APPLIED)"],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            assert versions[:2] == ["2.21.0", "0.28.1"]
            assert "gloo-process-set-interface" in versions
            # The distributed key logs in; the host name resolves to the device's own address.
            login = subprocess.run(
                ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                 "-o", "UserKnownHostsFile=/dev/null", f"root@{address}",
                 "hostname; getent hosts $(hostname)"],
                capture_output=True, text=True, timeout=60, check=True,
            ).stdout.split()  # fmt: skip
            assert login[0] == name and login[1] == address
            with urllib.request.urlopen(f"http://{address}:9100/metrics", timeout=10) as response:
                assert b"node_cpu_seconds_total" in response.read()

        assert parse_host_files(str(out / "hosts")) == ",".join(f"{a}:1" for a in addresses)
        assert (out / "elastic-hosts").read_text().split() == [f"{a}:1" for a in addresses]
        discovered = subprocess.run(
            [str(out / "discover-hosts.sh")], capture_output=True, text=True, check=True
        ).stdout.split()
        assert discovered == [f"{a}:1" for a in addresses]
        node_targets = json.loads((out / "targets" / "node" / "devices.json").read_text())
        assert [entry["targets"] for entry in node_targets] == [[f"{a}:9100"] for a in addresses]
        assert node_targets[0]["labels"]["link_profile"] == PROFILE
        worker_targets = json.loads((out / "targets" / "globaldl" / "devices.json").read_text())
        assert [entry["labels"]["rank"] for entry in worker_targets] == ["0", "1"]
        assert "emulated" in (out / "sites.yaml").read_text()
    finally:
        subprocess.run(["rm", "-rf", str(prefix_root)], check=False)
