"""Interface counters of real horovodrun runs on the fleet against the byte accounting's model."""

from __future__ import annotations

import json
import os
import sys

import pytest
from fleet_support import needs_fleet_system

from globaldl.fleet.accounting import account_bytes
from globaldl.fleet.calibration import measure_calibration
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.launcher import run_on_fleet
from globaldl.fleet.readings import cycles_in_timeline
from globaldl.fleet.request import TrainRequest

pytestmark = [needs_fleet_system, pytest.mark.horovod]

CYCLE_TIME_MS = 50.0
# The model's parts are of two kinds. Exact: headers (packet counts), gradients and every other
# collective (bytes from the summary through Gloo's algorithms and framing), log lines (counted).
# Measured in the calibration run or estimated, each with the spread seen on these machines
# (4 x 0.4 cores, LeNet top-k + int8, 20-30 steps): coordination, bytes per idle cycle x the
# cycles counted, reproduced the run within 3% on the AMD EPYC machine (load average 10-30 from
# other work), but on the Intel Xeon machine (quiet) the run sent 9% less to 28% more per cycle
# than the idle calibration (32 device runs in 8 runs; the 28% once, rank 0 in CI): its share
# is 30%; Horovod's init, 10.8-17.6 kB per device, varies with how long ranks wait for each
# other at the rendezvous (50%); retransmissions, segments x mean payload per segment (30%);
# the launch's ssh sessions, 6.7-7.0 kB, steady (with the ssh keepalive, a device answers one
# small probe per 5 s its session is quiet; the calibration's launch counts those of its run).
# The density is 5% so that the gradients outweigh those spreads: leaving out half of them (the
# ring-allreduce factor 1.5 instead of the allgather's 3) misses by about 200 kB per device,
# more than twice the bound.
COORDINATION_SHARE, INIT_SHARE, RETRANSMISSION_SHARE = 0.3, 0.5, 0.3
SLACK_BYTES = 2_000


def _bound(account) -> float:
    """How far a device's measured bytes may stray from the model (see the shares above)."""
    return (
        COORDINATION_SHARE * account.coordination_tx_bytes_model
        + INIT_SHARE * account.init_tx_bytes
        + RETRANSMISSION_SHARE * account.measured.retransmitted_payload_bytes
        + SLACK_BYTES
    )


def test_one_device_fleet_run_rendezvous_at_the_host_whatever_order_horovod_sets_take(
    test_fleet, tmp_path
):
    """The `devices` experiment's 1-device runs died in Gloo's rendezvous (HTTP GET failed).

    horovodrun probes one device's interfaces against the device itself, so `lo` passes as
    routed; it then picks `lo` or `eth0` in Python set order. PYTHONHASHSEED=0 orders `lo`
    first (the rendezvous address becomes 127.0.0.1 inside the device): `fleet run` must not
    leave the choice to Horovod.
    """
    test_fleet.up("-n", "1", "--profile", "custom:100:100", "--cpu", "1")
    test_fleet.extra_env.update({"PYTHONHASHSEED": "0", "HOROVOD_TIMELINE": "DYNAMIC"})
    completed = test_fleet.cli(
        "run",
        "--exec",
        "--timeout-seconds",
        "240",
        "--",
        sys.executable,
        "-m",
        "globaldl.fleet.coordination",
        "probe",
        str(tmp_path),
        "0",
        "0.5",
        "eth0",
        timeout_seconds=300,
    )
    assert completed.returncode == 0, f"{completed.stdout[-2000:]}\n{completed.stderr[-3000:]}"
    assert "HTTP GET request failed" not in completed.stderr
    record = json.loads((tmp_path / "rank-00000.json").read_text())
    assert record["ranks"] == 1 and record["host"] == test_fleet.device(1)


def test_compressed_four_device_run_sends_what_the_allgather_model_says(test_fleet, tmp_path):
    """Top-k 5% + int8 on 4 devices: every device's uplink bytes, explained part by part.

    The calibration (same fleet, same cycle time) gives each rank's bytes per idle Horovod
    cycle, its init and the launch's ssh sessions; rank 0's timeline counts the run's cycles.
    """
    test_fleet.up("-n", "4", "--profile", "custom:10000:10000", "--cpu", "0.4")
    fleet = Fleet(test_fleet.state_dir)
    calibration = measure_calibration(
        fleet, cycle_time_ms=CYCLE_TIME_MS, idle_seconds=4, settle_seconds=1
    )
    summary_path, timeline = tmp_path / "summary.json", tmp_path / "timeline.json"
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("GLOBALDL_")},
        "HOROVOD_CYCLE_TIME": f"{CYCLE_TIME_MS:g}",
        "HOROVOD_TIMELINE": str(timeline),
        "HOROVOD_TIMELINE_MARK_CYCLES": "1",
    }
    train = ["--model", "lenet", "--dataset", "mnist", "--epochs", "1"]
    train += ["--max-steps-per-epoch", "20", "--prune", "topk", "--density", "0.05"]
    train += ["--quantize", "int8"]
    result = run_on_fleet(
        fleet,
        TrainRequest(tuple(train), run_id="accounting", summary_path=summary_path),
        env=env,
        timeout_seconds=900,
    )
    assert result.returncode == 0
    summary = json.loads(summary_path.read_text())
    assert summary["exchange"]["combine"] == "gather"
    assert summary["traffic"]["tx_bytes_per_wire_byte"] == 3
    # Per device, the allgather sends 3x the payload where dense Horovod's ring sends 1.5x.
    assert summary["traffic"]["traffic_ratio_vs_dense"] == pytest.approx(
        summary["compression_ratio"] / 2
    )
    cycles = cycles_in_timeline(env, since_unix_seconds=0)
    assert cycles is not None and cycles > 0
    accounting = account_bytes(
        result.counters_before,
        result.counters_after,
        summary,
        result.seconds,
        log_bytes_by_rank=result.worker_output.bytes_by_rank,
        summary_written_unix_seconds=summary_path.stat().st_mtime,
        cycle_time_ms=CYCLE_TIME_MS,
        calibration=calibration,
        coordination_cycles=cycles,
    )
    report = accounting.report()
    print(f"\n{report}\ncycles {cycles}, calibration {json.dumps(calibration.to_dict())}")
    assert [account.rank for account in accounting.devices] == [0, 1, 2, 3]
    for account in accounting.devices:
        assert account.unexplained_tx_bytes is not None
        assert abs(account.unexplained_tx_bytes) <= _bound(account), report
        # The bound is tight enough to tell the two factors apart.
        assert 0.5 * account.gradient_tx_bytes > 2 * _bound(account), report
