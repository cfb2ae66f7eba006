"""One real experiment run: fleet up, horovodrun over ssh into 2 devices, scrapes, outputs, down."""

from __future__ import annotations

import csv
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from experiment_fleet_support import fleet_skip_reason, free_subnet, leftovers

from globaldl.experiments import ExperimentRunner, ResourcesExperiment, run_experiment
from globaldl.fleet.cycle_time import auto_cycle_time_ms
from globaldl.fleet.fleet import Fleet

SKIP_REASON = fleet_skip_reason()
pytestmark = [
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    pytest.mark.horovod,
]


@pytest.fixture()
def fleet_names() -> Iterator[tuple[str, str, Path]]:
    """A unique prefix, free subnet and state dir; nothing of them may remain afterwards."""
    prefix = f"gx{secrets.token_hex(2)}"
    state_dir = Path(f"/run/gdl-test-{prefix}")
    try:
        yield prefix, free_subnet(), state_dir
    finally:
        Fleet(state_dir).down()  # a no-op when the runner brought it down, as it should
        left = leftovers(prefix, state_dir)
        assert not left, f"the experiment left behind: {left}"


def test_runner_trains_on_a_real_fleet_scrapes_it_and_writes_the_outputs(
    fleet_names: tuple[str, str, Path], tmp_path: Path
) -> None:
    prefix, subnet, state_dir = fleet_names
    out = tmp_path / "out"
    experiment = ResourcesExperiment(
        layers=(1,),
        batch_sizes=(16,),
        devices=2,
        profile="custom:50:50",
        cpu_cores_per_device=0.5,
        epochs=1,
        max_steps_per_epoch=4,
    )
    progress: list[str] = []
    runner = ExperimentRunner(
        out,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        refuse_if_up=(),
        scrape_interval_seconds=0.5,
        progress=progress.append,
    )
    report = run_experiment(experiment, runner, out, command="pytest")

    (result,) = report.results
    log = (result.run_dir / "fleet-run.log").read_text(errors="replace")
    assert result.ok, f"{result.status}\n{log[-3000:]}"
    summary = result.summary
    assert summary is not None
    assert (summary["ranks"], summary["steps"], len(summary["history"])) == (2, 4, 1)
    assert summary["run_id"] == result.run_id
    # The fleet's interface counters were read around the run, for both devices.
    assert result.accounting is not None
    assert [d["device"] for d in result.accounting["devices"]] == [f"{prefix}-1", f"{prefix}-2"]
    assert all(d["tx_bytes"] > summary["gradient_bytes_wire"] for d in result.accounting["devices"])
    # Every device's own exporter was scraped over the bridge while it trained.
    assert set(result.resources) == {f"{prefix}-1", f"{prefix}-2"}
    for resources in result.resources.values():
        assert resources.scrapes >= 2 and 1 <= resources.steps <= 4
        assert resources.cpu_seconds > 0 and resources.resident_memory_peak_bytes > 100 * 2**20
        assert resources.network_transmit_bytes > summary["gradient_bytes_wire"] / 2
    # The schedule, the run starting (with an estimate) and its outcome with the machine load.
    assert progress[0].startswith("1 runs (1 x 1 repeats, interleaved); ETA unknown")
    assert progress[1].startswith("[1/1] resources mlp-l1-b16 (repeat 1/1): starting; ETA")
    assert progress[2].startswith("[1/1] resources mlp-l1-b16 (repeat 1/1): ok, 4 steps x 2 ranks")
    assert "outside the fleet" in progress[2] and len(progress) == 3
    # The load record: the devices' CPU from the fleet's cgroup accounting (TensorFlow on two
    # devices), our own fleet run/horovodrun/ssh apart from it, and what ran outside.
    load = result.load
    assert load is not None and load.seconds > 5
    assert load.devices_cpu_seconds is not None and load.devices_cpu_seconds > 2.0
    assert load.driver_cpu_seconds > 0.5  # fleet run's Python, horovodrun's driver, ssh
    assert load.outside_cpu_seconds is not None and load.busy is not None
    # The workers' own CPU seconds, read by their exporters over part of the run, fit inside
    # what the cgroups counted for the devices over all of it.
    scraped = sum(resources.cpu_seconds for resources in result.resources.values())
    assert 0 < scraped <= load.devices_cpu_seconds

    for name in (
        "resources.csv",
        "resources-runs.csv",
        "resources.json",
        "resources.md",
        "resources-devices.csv",
        "resources.png",
    ):
        assert (out / name).stat().st_size > 0, name
    with (out / "resources.csv").open() as stream:
        (row,) = list(csv.DictReader(stream))
    assert row["status"] == "ok"
    assert float(row["horovod_cycle_time_ms"]) == auto_cycle_time_ms(50_000, 50_000)
    assert row["train_command"].startswith(
        "globaldl train --model mlp --dataset mnist --layers 1 --batch-size 16 --epochs 1 "
        "--max-steps-per-epoch 4 --seed 0 --run-id "
    )
    assert "--metrics-port 19500" in row["train_command"]
    assert float(row["memory_peak_mb"]) > 100
    document = json.loads((out / "resources.json").read_text())
    assert document["runs"][0]["summary"]["steps"] == 4
    assert result.run_dir == out / "runs" / "mlp-l1-b16" / "repeat-1"
    assert json.loads((result.run_dir / "result.json").read_text())["status"] == "ok"
    assert document["runs"][0]["load"]["devices_cpu_seconds"] > 2.0
    # The runner brought its fleet down itself.
    assert Fleet(state_dir).state() is None
