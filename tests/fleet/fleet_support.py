"""Helpers for fleet tests: unique names and subnet per test, a CLI runner, leftover checks."""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from globaldl.fleet.fleet import host_networks

CLI_TIMEOUT_SECONDS = 120
KNOWN_HOSTS = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"


def fleet_host_keys(state_dir: Path) -> list[str]:
    """The base64 part of every device's sshd host key in a fleet's state ([] if none)."""
    state = read_text_or_none(Path(state_dir) / "fleet.json")
    if state is None:
        return []
    return [device["host_key_public"].split()[1] for device in json.loads(state)["devices"]]


def read_text_or_none(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _system_skip_reason() -> str | None:
    """Why fleet tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "fleet tests need root (namespaces, links, qdiscs, cgroups)"
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/usr/sbin/sshd").exists():
        return "/usr/sbin/sshd is not installed"
    for controller in ("cpu", "memory"):
        if not Path(f"/sys/fs/cgroup/{controller}/cgroup.procs").exists():
            return (
                f"cgroup v1 {controller} controller is not mounted at /sys/fs/cgroup/{controller}"
            )
    probe = subprocess.run(
        ["unshare", "--net", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return f"cannot create network namespaces: {probe.stderr.strip()}"
    return None


SKIP_REASON = _system_skip_reason()
needs_fleet_system = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def free_subnet() -> str:
    """A /24 in 10.213-10.223 that overlaps no address or route of this machine."""
    used = [network for network, _ in host_networks()]
    for _ in range(200):
        candidate = ipaddress.ip_network(
            f"10.{random.randint(213, 223)}.{random.randint(0, 255)}.0/24"
        )
        if not any(candidate.overlaps(network) for network in used):
            return str(candidate)
    raise RuntimeError("no free test subnet found")


@dataclass
class FleetUnderTest:
    """One test's fleet: its unique prefix, subnet and state dir, and a CLI runner bound to them."""

    prefix: str
    subnet: str
    state_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    # Its devices' sshd host keys, read after each `up`: what known_hosts must not keep.
    host_keys: set[str] = field(default_factory=set)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "GLOBALDL_FLEET_STATE_DIR": str(self.state_dir), **self.extra_env}

    def cli_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "globaldl.cli.fleet", *args]

    def cli(
        self, *args: str, timeout_seconds: float = CLI_TIMEOUT_SECONDS
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cli_argv(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
        )

    def up_killed_once(self, devices: int, *args: str) -> int:
        """Start `fleet up ARGS` and SIGKILL it once `devices` devices are recorded; its exit code.

        Waits at most 60 s for the devices before killing it anyway.
        """
        up = subprocess.Popen(
            self.cli_argv("up", "--prefix", self.prefix, "--subnet", self.subnet, *args),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            state_file = self.state_dir / "fleet.json"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                state = json.loads(state_file.read_text()) if state_file.exists() else {}
                if len(state.get("devices", [])) >= devices:
                    break
                time.sleep(0.05)
            up.send_signal(signal.SIGKILL)
            up.communicate(timeout=30)
        finally:
            if up.poll() is None:
                up.kill()
        return up.returncode

    def up(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`fleet up ARGS` with this test's prefix and subnet; fails the test if it fails."""
        completed = self.cli("up", "--prefix", self.prefix, "--subnet", self.subnet, *args)
        assert completed.returncode == 0, (
            f"fleet up failed:\n{completed.stdout}\n{completed.stderr}"
        )
        self.host_keys.update(fleet_host_keys(self.state_dir))
        return completed

    def state(self) -> dict:
        return json.loads((self.state_dir / "fleet.json").read_text())

    def device(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def address(self, index: int) -> str:
        return str(list(ipaddress.ip_network(self.subnet).hosts())[index])


def leftovers(prefix: str, state_dir: Path) -> dict[str, list[str]]:
    """Everything on the machine that carries this test's prefix (should be empty after down)."""
    found: dict[str, list[str]] = {}
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split(
        "\n"
    )
    found["namespaces"] = [line.split()[0] for line in netns if line.startswith(f"{prefix}-")]
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    found["links"] = [link["ifname"] for link in links if link["ifname"].startswith(f"{prefix}-")]
    qdiscs = json.loads(
        subprocess.run(["tc", "-j", "qdisc", "show"], capture_output=True, text=True).stdout or "[]"
    )
    found["qdiscs"] = [
        f"{q['dev']} {q['kind']}" for q in qdiscs if q.get("dev", "").startswith(f"{prefix}-")
    ]
    found["cgroups"] = [
        str(path)
        for controller in ("cpu", "memory", "cpuacct")
        for path in [Path(f"/sys/fs/cgroup/{controller}/{prefix}-fleet")]
        if path.exists()
    ]
    found["sshd"] = [str(pid) for pid in sshd_pids_of(state_dir)]
    found["link_emulation"] = [str(pid) for pid in vde_pids_of(state_dir)]
    found["bridges"] = [
        link for link in found["links"] if Path(f"/sys/class/net/{link}/bridge").exists()
    ]
    found["etc_netns"] = (
        [str(path) for path in Path("/etc/netns").glob(f"{prefix}-*")]
        if Path("/etc/netns").exists()
        else []
    )
    found["ssh_client_config"] = [
        str(path) for path in Path("/etc/ssh/ssh_config.d").glob(f"globaldl-fleet-{prefix}.conf")
    ]
    found["state"] = [str(state_dir)] if state_dir.exists() else []
    return {kind: items for kind, items in found.items() if items}


def sshd_pids_of(state_dir: Path) -> list[int]:
    """Live (non-zombie) sshd processes started with a config below `state_dir`."""
    # sshd rewrites its argv ("sshd: /usr/sbin/sshd -f CONFIG ... [listener]").
    return _live_pids_of(state_dir, ("/usr/sbin/sshd",))


def vde_pids_of(state_dir: Path) -> list[int]:
    """Live vde_switch and wirefilter processes whose sockets or pid files are below `state_dir`."""
    return _live_pids_of(state_dir, ("/usr/bin/vde_switch", "/usr/bin/wirefilter"))


def _live_pids_of(state_dir: Path, executables: tuple[str, ...]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            executable = os.readlink(entry / "exe")
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and executable in executables and f"{state_dir}/" in cmdline:
            pids.append(int(entry.name))
    return pids


def force_clean(prefix: str, state_dir: Path) -> None:
    """Last resort when `fleet down` failed: remove anything with this test's unique prefix."""
    for pid in [*sshd_pids_of(state_dir), *vde_pids_of(state_dir)]:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    for name in leftovers(prefix, state_dir).get("namespaces", []):
        subprocess.run(["ip", "netns", "del", name], check=False)
    for name in leftovers(prefix, state_dir).get("links", []):
        subprocess.run(["ip", "link", "del", name], check=False)
    for controller in ("cpu", "cpuacct", "memory"):
        root = Path(f"/sys/fs/cgroup/{controller}/{prefix}-fleet")
        for child in sorted(root.glob("*/"), reverse=True) if root.exists() else []:
            if child.is_dir():
                child.rmdir()
        if root.exists():
            root.rmdir()
    for path in Path("/etc/netns").glob(f"{prefix}-*") if Path("/etc/netns").exists() else []:
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(state_dir, ignore_errors=True)


def _link_emulation_skip_reason() -> str | None:
    """Why links with delay cannot be tested here, or None."""
    if SKIP_REASON is not None:
        return SKIP_REASON
    from globaldl.fleet.vde import availability

    available, detail = availability()
    return None if available else f"link emulation unavailable: {detail}"


LINK_EMULATION_SKIP_REASON = _link_emulation_skip_reason()
needs_link_emulation = pytest.mark.skipif(
    LINK_EMULATION_SKIP_REASON is not None, reason=LINK_EMULATION_SKIP_REASON or ""
)
