"""One run of an experiment on a fleet that is up: `globaldl fleet run` and what it leaves.

The run is `globaldl fleet run -- <train args>` in a child process (real horovodrun over ssh
into the namespaces) whose output goes to the run's folder; while it runs, the machine's load
is recorded, devices are scraped or disturbed when the spec asks for it; afterwards the run
summary and the fleet's byte accounting are read back into a RunResult.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from globaldl.bench.results import machine_description
from globaldl.experiments.faults import FaultInjector
from globaldl.experiments.load import LoadRecorder, LoadSources
from globaldl.experiments.progress import ScheduledRun
from globaldl.experiments.results import RunResult, repeat_dir
from globaldl.experiments.scrape import ExporterScraper
from globaldl.experiments.spec import slug
from globaldl.files import write_json_atomically
from globaldl.fleet import cgroups
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.request import TrainRequest

if TYPE_CHECKING:
    from globaldl.experiments.runner import ExperimentRunner

START_TIMEOUT_SECONDS = 180
# After the fleet run's own timeout, how long it gets to stop its workers before we do.
STOP_GRACE_SECONDS = 60.0
FLEET_RUN_MODULE = "globaldl.cli.fleet"


def run_once(
    runner: ExperimentRunner,
    scheduled: ScheduledRun,
    latency_emulated: bool,
    sources: LoadSources,
) -> RunResult:
    """Run one repeat of one spec on the runner's fleet (up) and record what it left."""
    spec = scheduled.spec
    run_dir = repeat_dir(runner.out_dir, spec.label, scheduled.repeat)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = slug(f"{spec.experiment}-{spec.label}-r{scheduled.repeat}-{_utc_stamp()}")
    cycle_time_ms = runner.cycle_time_ms(spec)
    request = TrainRequest(
        train_args=spec.train_args,
        run_id=run_id,
        summary_path=(run_dir / "summary.json").resolve(),
        metrics_port=runner.metrics_port if spec.scrape_metrics else None,
    )
    argv = [
        sys.executable,
        "-m",
        FLEET_RUN_MODULE,
        "run",
        "--state-dir",
        str(runner.state_dir),
        "--timeout-seconds",
        f"{spec.timeout_seconds:g}",
        "--start-timeout-seconds",
        str(START_TIMEOUT_SECONDS),
        "--run-id",
        request.run_id,
        "--summary",
        str(request.summary_path),
    ]
    if request.metrics_port is not None:
        # Prometheus file-SD targets of the run go into the run's folder, not runs/.
        argv += ["--metrics-port", str(request.metrics_port)]
        argv += ["--prometheus-dir", str(run_dir / "prometheus")]
    argv += [*spec.fleet_run_args, "--", *spec.train_args]
    result = RunResult(
        spec=spec,
        status="running",
        run_id=run_id,
        run_dir=run_dir,
        cycle_time_ms=cycle_time_ms,
        link=runner.link_of(spec.fleet),
        train_command=request.command_line(),
        fleet_command=(
            f"HOROVOD_CYCLE_TIME={cycle_time_ms:g} "
            + shlex.join(["globaldl", "fleet", *argv[argv.index("run") :]])
        ),
        latency_emulated=latency_emulated,
        repeat=scheduled.repeat,
        machine=machine_description(),
    )
    scraper = None
    if spec.scrape_metrics:
        fleet_state = Fleet(runner.state_dir).require_state()
        scraper = ExporterScraper(
            {
                device.name: f"http://{device.address}:{runner.metrics_port}/metrics"
                for device in fleet_state.devices
            },
            interval_seconds=runner.scrape_interval_seconds,
        )
    recorder = LoadRecorder(sources, runner.busy_limits)
    recorder.start()
    started_wall = time.time()
    started = time.monotonic()
    log_path = run_dir / "fleet-run.log"
    with log_path.open("wb") as log:
        # Its own session: a Ctrl-C reaches only this process, which then asks `fleet run`
        # once to stop (a second SIGINT could cut short its clean-up of horovodrun).
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**_worker_environment(cycle_time_ms), **spec.env},
            start_new_session=True,
        )
        if sources.launcher_group is not None:
            # Before it starts horovodrun and ssh: they are born in the group too.
            cgroups.move_process(sources.launcher_group, process.pid)
        if scraper is not None:
            scraper.start()
        faults = None
        if spec.faults:
            faults = FaultInjector(
                spec.faults, log_path, Fleet(runner.state_dir), runner.prefix, process
            )
            faults.start()
        try:
            returncode = process.wait(timeout=spec.timeout_seconds + STOP_GRACE_SECONDS)
            result.status = "ok" if returncode == 0 else f"failed (exit {returncode})"
        except subprocess.TimeoutExpired:
            _stop(process)
            result.status = f"timed out after {spec.timeout_seconds:g} s"
        except BaseException:
            _stop(process)
            raise
        finally:
            result.load = recorder.stop()
            if scraper is not None:
                scraper.stop()
            if faults is not None:
                result.faults = faults.stop()
    result.run_seconds = time.monotonic() - started
    summary_path = request.summary_path
    if summary_path.exists() and summary_path.stat().st_mtime >= started_wall:
        result.summary = json.loads(summary_path.read_text())
        accounting_path = summary_path.with_name(f"{summary_path.stem}.fleet-bytes.json")
        if accounting_path.exists():
            result.accounting = json.loads(accounting_path.read_text())
    elif result.status == "ok":
        result.status = "no summary"
    if scraper is not None:
        for name, scrapes in scraper.devices.items():
            resources = scrapes.resources(spec.fleet.cpu_cores_per_device)
            if resources is not None:
                result.resources[name] = resources
    save_result(result)
    return result


def save_result(result: RunResult) -> None:
    """Write the run's record into its folder (`result.json`)."""
    write_json_atomically(result.run_dir / "result.json", result.to_dict())


def _worker_environment(cycle_time_ms: float) -> dict[str, str]:
    """The environment for horovodrun (which forwards it to every worker).

    GLOBALDL_* variables are dropped: a user's settings must not change an experiment's runs.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("GLOBALDL_")}
    env["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ask `fleet run` to stop (SIGINT: it stops horovodrun and the workers), then kill it."""
    for signum, wait_seconds in ((signal.SIGINT, STOP_GRACE_SECONDS), (signal.SIGKILL, 10.0)):
        if process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(timeout=wait_seconds)
            return
        except subprocess.TimeoutExpired:
            continue


def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
