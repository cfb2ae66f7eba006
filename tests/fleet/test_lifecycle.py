"""`fleet up`/`down` on the real system: what up creates; down (or a failed up) leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fleet_support import leftovers, needs_fleet_system, sshd_pids_of

from globaldl.fleet import sshd
from globaldl.fleet.links import DEVICE_INTERFACE

pytestmark = needs_fleet_system


def _ssh(fleet, address: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-i",
            str(fleet.state_dir / "ssh" / "id_ed25519"),
            f"root@{address}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_up_builds_limited_named_devices_and_down_removes_everything(test_fleet, assert_clean):
    test_fleet.up("--devices", "4", "--profile", "custom:5:20", "--memory", "256")
    state = test_fleet.state()
    assert [d["name"] for d in state["devices"]] == [test_fleet.device(i) for i in range(1, 5)]

    expected_cores = len(os.sched_getaffinity(0)) / 4
    status = json.loads(test_fleet.cli("status", "--json").stdout)
    for index, device in enumerate(status["devices"], start=1):
        assert device["address"] == test_fleet.address(index)
        assert device["sshd_alive"] and device["status"] == "up"
        # Default CPU share: the machine's cores split over 4 devices, as the kernel holds it.
        assert device["limits"]["cpu_cores"] == pytest.approx(expected_cores)
        assert device["limits"]["memory_limit_bytes"] == 256 * 2**20
        assert [q["rate_bits_per_second"] for q in device["uplink_qdiscs"]] == [5_000_000]
        assert [q["rate_bits_per_second"] for q in device["downlink_qdiscs"]] == [20_000_000]
    cpu_group = Path(f"/sys/fs/cgroup/cpu/{test_fleet.prefix}-fleet/{test_fleet.device(1)}")
    assert int((cpu_group / "cpu.cfs_quota_us").read_text()) == round(expected_cores * 100_000)
    memory_group = Path(f"/sys/fs/cgroup/memory/{test_fleet.prefix}-fleet/{test_fleet.device(1)}")
    assert int((memory_group / "memory.limit_in_bytes").read_text()) == 256 * 2**20

    # Each device has its own host name resolving to its own address, and its sshd (so every
    # process horovodrun starts there) runs inside the device's cgroups.
    answer = _ssh(test_fleet, test_fleet.address(2), "hostname; hostname -i; cat /proc/self/cgroup")
    assert answer.returncode == 0, answer.stderr
    hostname, address, *cgroup_lines = answer.stdout.strip().split("\n")
    assert (hostname, address) == (test_fleet.device(2), test_fleet.address(2))
    groups = {line.split(":")[1]: line.split(":")[2] for line in cgroup_lines}
    assert groups["cpu"] == groups["memory"] == f"/{test_fleet.prefix}-fleet/{test_fleet.device(2)}"
    assert test_fleet.cli("hosts").stdout.split() == [
        f"{test_fleet.address(i)}:1" for i in range(1, 5)
    ]

    assert leftovers(test_fleet.prefix, test_fleet.state_dir).keys() >= {
        "namespaces",
        "links",
        "qdiscs",
        "cgroups",
        "sshd",
    }
    first = test_fleet.cli("down")
    assert first.returncode == 0 and "removed" in first.stdout, first.stderr
    assert_clean(test_fleet)
    second = test_fleet.cli("down")
    assert second.returncode == 0 and "nothing to remove" in second.stdout


def test_failed_up_rolls_back_and_keeps_what_it_did_not_create(test_fleet, assert_clean):
    # Someone else's namespace holds the name device 3 needs: up fails mid-way, after devices
    # 1 and 2 (with their links, qdiscs, cgroups and sshd) already exist.
    clash = test_fleet.device(3)
    subprocess.run(["ip", "netns", "add", clash], check=True)
    try:
        failed = test_fleet.cli(
            "up",
            "--prefix",
            test_fleet.prefix,
            "--subnet",
            test_fleet.subnet,
            "-n",
            "3",
            "--profile",
            "custom:1:2",
        )
        assert failed.returncode == 1
        assert (
            f"network namespace {clash} already exists" in failed.stderr
            and "everything it created was removed" in failed.stderr
        )
        assert f"creating {test_fleet.device(2)}" in failed.stderr
        left = leftovers(test_fleet.prefix, test_fleet.state_dir)
        assert left == {"namespaces": [clash]}, left
    finally:
        subprocess.run(["ip", "netns", "del", clash], check=False)
    assert_clean(test_fleet)


def test_address_clash_is_refused_before_anything_is_created(test_fleet, assert_clean):
    # A link of ours (test prefix) holding an address inside the fleet's subnet.
    squatter = f"{test_fleet.prefix}-x"
    subprocess.run(
        ["ip", "link", "add", squatter, "type", "veth", "peer", "name", f"{squatter}p"], check=True
    )
    try:
        subprocess.run(
            ["ip", "addr", "add", f"{test_fleet.address(5)}/24", "dev", squatter], check=True
        )
        failed = test_fleet.cli(
            "up",
            "--prefix",
            test_fleet.prefix,
            "--subnet",
            test_fleet.subnet,
            "-n",
            "2",
            "--profile",
            "custom:1:2",
        )
        assert failed.returncode == 2
        assert (
            f"subnet {test_fleet.subnet} clashes with {test_fleet.address(5)}/24 on {squatter}"
            in failed.stderr
        )
        assert "creating" not in failed.stderr
    finally:
        subprocess.run(["ip", "link", "del", squatter], check=False)
    assert_clean(test_fleet)


def test_down_cleans_up_after_fleet_up_is_killed_mid_way(test_fleet, assert_clean):
    returncode = test_fleet.up_killed_once(2, "-n", "6", "--profile", "custom:1:2")
    assert returncode == -signal.SIGKILL
    before = leftovers(test_fleet.prefix, test_fleet.state_dir)
    assert len(before.get("namespaces", [])) >= 2 and sshd_pids_of(test_fleet.state_dir), before
    down = test_fleet.cli("down")
    assert down.returncode == 0, down.stderr
    assert_clean(test_fleet)


def test_bad_input_gives_clear_errors_and_creates_nothing(test_fleet, assert_clean):
    common = ("--prefix", test_fleet.prefix, "--subnet", test_fleet.subnet)
    cases = [
        (
            ("-n", "2", "--profile", "wifi"),
            "unknown profile 'wifi'; valid profiles: fibre, geo-satellite, intercontinental, lan,",
        ),
        (("-n", "0", "--profile", "custom:1:1"), "--devices must be at least 1, got 0"),
        (("-n", "4", "--profile", "custom:1:1", "--cpu", "1"), "more than this machine's"),
        (
            ("-n", "2", "--profile", "custom", "--up-mbit", "5"),
            "needs both --up-mbit and --down-mbit",
        ),
        (("--mix", "lte:x"), "is not an integer"),
        (
            ("-n", "1", "--profile", "lan", "--congestion-control", "vegas"),
            "--congestion-control 'vegas' is not offered by this kernel; available:",
        ),
    ]
    for args, message in cases:
        completed = test_fleet.cli("up", *common, *args)
        assert completed.returncode == 2, (args, completed.stderr)
        assert message in completed.stderr, (args, completed.stderr)
    assert_clean(test_fleet)


def test_latency_off_shapes_rates_only_and_says_delay_is_not_emulated(test_fleet, assert_clean):
    shaped = test_fleet.up("-n", "1", "--profile", "lte", "--latency", "off")
    assert "delay/jitter/loss NOT emulated (rates only)" in shaped.stdout
    status = json.loads(test_fleet.cli("status", "--json").stdout)
    assert not status["latency_emulated"] and status["devices"][0]["link"] == "veth"
    assert [q["kind"] for q in status["devices"][0]["uplink_qdiscs"]] == ["tbf"]
    assert "delay/jitter/loss not emulated" in test_fleet.cli("status").stdout


def test_kill_takes_a_device_out_and_revive_brings_it_back(test_fleet):
    test_fleet.up("-n", "2", "--profile", "custom:10:10")
    assert test_fleet.cli("kill", test_fleet.device(2)).returncode == 0
    assert test_fleet.cli("hosts").stdout.split() == [f"{test_fleet.address(1)}:1"]
    connect = f"import socket; socket.create_connection(({test_fleet.address(2)!r}, 22), timeout=2)"
    probe = subprocess.run(
        ["ip", "netns", "exec", test_fleet.device(1), sys.executable, "-c", connect],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert probe.returncode != 0 and (
        "timed out" in probe.stderr or "unreachable" in probe.stderr
    ), probe.stderr
    assert test_fleet.cli("revive", test_fleet.device(2)).returncode == 0
    assert test_fleet.cli("hosts").stdout.split() == [f"{test_fleet.address(i)}:1" for i in (1, 2)]
    assert _ssh(test_fleet, test_fleet.address(2), "hostname").stdout.strip() == test_fleet.device(
        2
    )
    unknown = test_fleet.cli("kill", "nope")
    assert (
        unknown.returncode == 2
        and f"devices: {test_fleet.device(1)}, {test_fleet.device(2)}" in unknown.stderr
    )


def test_a_session_to_a_device_that_vanishes_without_closing_it_ends_within_the_keepalive(
    test_fleet,
):
    """horovodrun's ssh (Horovod's own options) must end, or Horovod Elastic waits for good."""
    test_fleet.up("-n", "1", "--profile", "custom:10:10")
    address = test_fleet.address(1)
    assert f"Host {address}" in sshd.keepalive_config_path(test_fleet.prefix).read_text()
    effective = subprocess.run(
        ["ssh", "-G", address], capture_output=True, text=True, timeout=10, check=True
    ).stdout.splitlines()
    assert "serveraliveinterval 5" in effective, effective
    assert "serveralivecountmax 3" in effective, effective  # no delay on the link: 3 misses
    session = subprocess.Popen(
        # The command line of horovod/runner/util/remote.py, with its options only.
        ["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", address]
        + ["-i", str(test_fleet.state_dir / "ssh" / "id_ed25519"), "echo up; sleep 600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert session.stdout is not None and session.stdout.readline().strip() == "up"
        # The device vanishes: nothing on it is killed or closed, its link just goes.
        subprocess.run(
            ["ip", "-n", test_fleet.device(1), "link", "set", DEVICE_INTERFACE, "down"],
            check=True,
            timeout=10,
        )
        vanished = time.monotonic()
        session.wait(timeout=60)
        # 3 keepalives 5 s apart go unanswered; ssh gives up with 255.
        assert session.returncode == 255
        assert time.monotonic() - vanished < 3 * 5 + 10
    finally:
        session.kill()
        session.wait()
