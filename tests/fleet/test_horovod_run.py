"""Training across the fleet through horovodrun over each device's sshd, and crash clean-up."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fleet_support import leftovers, needs_fleet_system

from globaldl.fleet.timeline import read_events, waits

pytestmark = [needs_fleet_system, pytest.mark.horovod]

BIN = Path(sys.executable).parent
PROBE = Path(__file__).with_name("horovod_probe.py")
RUN_TIMEOUT_SECONDS = "240"


def _probe_reports(stdout: str) -> list[dict]:
    return [
        json.loads(line.split("PROBE ", 1)[1]) for line in stdout.splitlines() if "PROBE {" in line
    ]


def test_two_device_shaped_delayed_horovod_run_completes_and_interface_bytes_match(
    test_fleet, tmp_path
):
    # 10 Mbit/s each way and 25 ms one-way on each access link (vde2): 50 ms device to device.
    test_fleet.up("-n", "2", "--profile", "custom:10:10:25")
    summary = tmp_path / "summary.json"
    prometheus_dir = tmp_path / "prometheus"
    tensor_bytes, steps = 1_000_000, 3
    test_fleet.extra_env["PROBE_TARGETS_DIR"] = str(prometheus_dir / "targets" / "globaldl")
    completed = test_fleet.cli(
        "run",
        "--exec",
        "--summary",
        str(summary),
        "--run-id",
        "probe-run",
        "--metrics-port",
        "19400",
        "--prometheus-dir",
        str(prometheus_dir),
        "--timeout-seconds",
        RUN_TIMEOUT_SECONDS,
        "--",
        sys.executable,
        str(PROBE),
        str(summary),
        str(tensor_bytes),
        str(steps),
        timeout_seconds=300,
    )
    assert completed.returncode == 0, f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"

    reports = sorted(_probe_reports(completed.stdout), key=lambda report: report["rank"])
    assert [(r["rank"], r["size"], r["host"]) for r in reports] == [
        (0, 2, test_fleet.device(1)),
        (1, 2, test_fleet.device(2)),
    ]
    assert all(report["sum"] == 3.0 for report in reports)  # 1 + 2: a real allreduce across devices
    # Each rank sends ~tensor_bytes per allreduce through its 10 Mbit/s uplink: the exchange
    # cannot be faster than the shaped link allows.
    # Every allreduce also waits at least one 50 ms one-way trip for the other device's data.
    floor_seconds = tensor_bytes * steps * 8 / 10e6 + steps * 0.05
    assert all(report["exchange_seconds"] >= 0.8 * floor_seconds for report in reports), reports
    # `fleet run` set Horovod for the links and counted the forwarding CPU apart from devices.
    assert "fleet run: HOROVOD_GLOO_TIMEOUT_SECONDS=30" in completed.stderr
    links = json.loads(summary.with_name("summary.links.json").read_text())
    assert links["gloo_timeout_seconds"] == 30 and links["emulation_cpu_seconds"] > 0
    # Each device's TCP congestion control, as its namespace runs it (the host's default here).
    default = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    assert links["tcp_congestion_control"] == {
        test_fleet.device(1): default,
        test_fleet.device(2): default,
    }
    # Every device's exporter was registered with Prometheus file-SD while the run lasted.
    assert reports[0]["targets"] == [
        f"{test_fleet.address(1)}:19400",
        f"{test_fleet.address(2)}:19400",
    ]
    assert not (prometheus_dir / "targets" / "globaldl" / "probe-run.json").exists()

    accounting = json.loads(summary.with_name("summary.fleet-bytes.json").read_text())
    assert accounting["gradient_bytes_wire"] == tensor_bytes * steps and accounting["ranks"] == 2
    for device in accounting["devices"]:
        assert (
            device["tx_bytes"] >= tensor_bytes * steps
        )  # the gradients really crossed each uplink
        assert device["rx_bytes"] >= tensor_bytes * steps
    assert 1.0 <= accounting["tx_to_wire_ratio"] <= 1.5, accounting
    assert "each device sends 1x that (ring allreduce, 2(N-1)/N)" in completed.stdout
    print(
        f"\nprobe run: tx/wire {accounting['tx_to_wire_ratio']:.3f}, exchange "
        f"{reports[0]['exchange_seconds']:.2f} s (link floor {floor_seconds:.2f} s)"
    )


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)


def test_crashed_run_then_down_leaves_nothing(test_fleet):
    test_fleet.up("-n", "2", "--profile", "custom:20:20")
    # A worker that prints where it runs, then holds the device until it is killed.
    worker = (
        "import os, socket, time; print('READY', socket.gethostname(), os.getpid(), flush=True); "
        "time.sleep(120)"
    )
    run = subprocess.Popen(
        test_fleet.cli_argv(
            "run",
            "--exec",
            "--timeout-seconds",
            RUN_TIMEOUT_SECONDS,
            "--",
            sys.executable,
            "-c",
            worker,
        ),
        env=test_fleet.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(run.stdout, lines), daemon=True).start()
    try:
        ready: dict[str, int] = {}
        deadline = time.monotonic() + 120
        while len(ready) < 2 and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if "READY " in line:
                host, pid = line.split("READY ", 1)[1].split()[:2]
                ready[host] = int(pid)
        assert set(ready) == {test_fleet.device(1), test_fleet.device(2)}, ready
        victim = ready[test_fleet.device(2)]
        cgroup = Path(
            f"/sys/fs/cgroup/cpu/{test_fleet.prefix}-fleet/{test_fleet.device(2)}/cgroup.procs"
        )
        assert (
            str(victim) in cgroup.read_text().split()
        )  # the worker runs inside the device's limits
        os.kill(victim, signal.SIGKILL)
        run.wait(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0
    # After the failed run only the sshd listeners remain on the devices...
    for index in (1, 2):
        procs = Path(
            f"/sys/fs/cgroup/cpu/{test_fleet.prefix}-fleet/{test_fleet.device(index)}/cgroup.procs"
        )
        assert len(procs.read_text().split()) == 1
    # ...and down removes everything (the fixture re-checks after its own down).
    assert test_fleet.cli("down").returncode == 0
    assert not leftovers(test_fleet.prefix, test_fleet.state_dir)


# Horovod's coordination payload per rank and cycle, measured by the coordination probe on 4
# devices: 310-620 B (2 devices exchange fewer messages); the launch's ssh sessions ~7 kB and
# Horovod's init 11-18 kB per device. The bound allows 700 B per cycle and 40 kB.
COORDINATION_PAYLOAD_BYTES_PER_CYCLE = 700
LAUNCH_AND_INIT_PAYLOAD_BYTES = 40_000


@pytest.mark.slow
def test_fleet_train_run_interface_bytes_agree_with_summary(test_fleet, tmp_path):
    test_fleet.up("-n", "2", "--profile", "custom:20:20")
    summary = tmp_path / "summary.json"
    # Rank 0's timeline marks Horovod's cycles, which the byte accounting counts.
    test_fleet.extra_env.update(
        {
            "HOROVOD_CYCLE_TIME": "50",
            "HOROVOD_TIMELINE": str(tmp_path / "timeline.json"),
            "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        }
    )
    completed = test_fleet.cli(
        "run",
        "--summary",
        str(summary),
        "--metrics-port",
        "19460",
        "--prometheus-dir",
        str(tmp_path / "prom"),
        "--timeout-seconds",
        RUN_TIMEOUT_SECONDS,
        "--",
        "--model",
        "mlp",
        "--dataset",
        "digits",
        "--epochs",
        "1",
        "--max-steps-per-epoch",
        "10",
        timeout_seconds=300,
    )
    assert completed.returncode == 0, f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    result = json.loads(summary.read_text())
    assert result["ranks"] == 2 and result["steps"] == 10
    # The trainer names devices by host name: each fleet device has its own.
    assert test_fleet.device(1) in result["devices"]
    assert result["exchange"]["combine"] == "sum"
    accounting = json.loads(summary.with_name("summary.fleet-bytes.json").read_text())
    wire = result["gradient_bytes_wire"]
    assert accounting["gradient_bytes_wire"] == wire and wire > 0
    assert accounting["tx_bytes_per_wire_byte"] == 1  # a ring allreduce on 2 ranks
    cycles = accounting["coordination_cycles"]
    assert cycles is not None and cycles > 0
    # The same timeline read as exchanges: the 10 steps' gradient allreduces, each after at
    # least one cycle of the loop, every cycle one of those the accounting counted.
    found = waits(read_events(tmp_path / "timeline.json"))
    steps = [wait for wait in found if wait.as_row()["kinds"] == "ALLREDUCE"]
    assert len(steps) >= 9
    assert all(wait.cycles >= 1 and wait.seconds > 0 for wait in steps)
    assert sum(wait.cycles for wait in found) <= cycles
    for device in accounting["devices"]:
        # Exact: headers from packet counts; the gradients, the broadcast, the validation sums
        # and digest gathers through Gloo's algorithms; log lines; retransmissions estimated.
        # What is left is the launch, init and coordination: at least nothing, at most their
        # measured size.
        beyond = device["coordination_payload_bytes"]
        assert beyond >= 0, device
        assert (
            beyond <= COORDINATION_PAYLOAD_BYTES_PER_CYCLE * cycles + LAUNCH_AND_INIT_PAYLOAD_BYTES
        ), device
        assert device["gradient_tx_bytes"] >= wire
    print(
        f"\ntrain run: gradient_bytes_wire {wire:,}, tx/wire {accounting['tx_to_wire_ratio']:.3f}, "
        f"{cycles} cycles, beyond the run's own data per device: "
        + ", ".join(f"{d['coordination_payload_bytes']:,.0f} B" for d in accounting["devices"])
    )


def test_unreachable_device_fails_fleet_run_within_the_stated_wait(test_fleet):
    """A device whose link went down without `fleet kill`: a clear error, not a hang."""
    test_fleet.up("-n", "2", "--profile", "custom:10:10", "--cpu", "0.25")
    subprocess.run(
        ["ip", "netns", "exec", test_fleet.device(2), "ip", "link", "set", "eth0", "down"],
        check=True,
        timeout=30,
    )
    started = time.monotonic()
    run = test_fleet.cli("run", "--exec", "--", "hostname")
    waited = time.monotonic() - started
    assert run.returncode == 2, run.stdout + run.stderr
    assert (
        f"device {test_fleet.device(2)} ({test_fleet.address(2)}) is unreachable" in run.stderr
        and "within 5 s" in run.stderr
    ), run.stderr
    assert waited < 60, waited
