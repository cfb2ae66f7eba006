"""Run an experiment's plan on the emulated fleet: fleet up, `fleet run` per run, fleet down.

Each group of adjacent runs that need the same fleet shares one `fleet up`; the fleet always
comes down in a `finally`, also after Ctrl-C, a failed run or a timeout. Experiments use their
own state dir, name prefix and subnet, so they never touch a fleet a user brought up, and they
refuse to start while any fleet is up (it would compete for the same cores).

Every run is `globaldl fleet run -- <train args>` in a child process (real horovodrun over ssh
into the namespaces), its output kept in the run's folder; the runner reads back the run
summary and the fleet's byte accounting, and optionally scrapes every device's exporter.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from globaldl.experiments.analysis import mean_step_seconds, training_seconds
from globaldl.experiments.cycle_time import auto_cycle_time_ms
from globaldl.experiments.scrape import DeviceResources, ExporterScraper
from globaldl.experiments.spec import Fault, FleetConfig, RunSpec, slug
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.plan import FleetPlan, plan_from_options
from globaldl.fleet.profiles import (
    DEFAULT_PROFILES_PATH,
    LinkProfile,
    device_profiles,
    load_profiles,
)
from globaldl.fleet.state import DEFAULT_STATE_DIR

DEFAULT_EXPERIMENT_STATE_DIR = Path("/run/globaldl-experiments")
DEFAULT_EXPERIMENT_PREFIX = "gdlx"
DEFAULT_EXPERIMENT_SUBNET = "10.78.0.0/24"
DEFAULT_METRICS_PORT = 19500
DEFAULT_SCRAPE_INTERVAL_SECONDS = 1.0
START_TIMEOUT_SECONDS = 180
# After the fleet run's own timeout, how long it gets to stop its workers before we do.
STOP_GRACE_SECONDS = 60.0
FLEET_RUN_MODULE = "globaldl.cli.fleet"

Progress = Callable[[str], None]


@dataclass
class RunResult:
    """What one run produced: its status, the summary and byte accounting, scraped resources."""

    spec: RunSpec
    status: str
    run_id: str
    run_dir: Path
    cycle_time_ms: float
    link: LinkProfile
    train_command: str
    fleet_command: str
    latency_emulated: bool | None = None
    run_seconds: float | None = None
    summary: dict[str, Any] | None = None
    accounting: dict[str, Any] | None = None
    resources: dict[str, DeviceResources] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The run finished and left a summary."""
        return self.status == "ok" and self.summary is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Inverse of `to_dict` (to rebuild tables from a results folder)."""
        return cls(
            spec=RunSpec.from_config(data["spec"]),
            status=data["status"],
            run_id=data["run_id"],
            run_dir=Path(data["run_dir"]),
            cycle_time_ms=data["cycle_time_ms"],
            link=LinkProfile.from_config(data["link"]),
            train_command=data["train_command"],
            fleet_command=data["fleet_command"],
            latency_emulated=data["latency_emulated"],
            run_seconds=data["run_seconds"],
            summary=data["summary"],
            accounting=data["accounting"],
            resources={
                name: DeviceResources(**values) for name, values in data["resources"].items()
            },
            faults=data.get("faults", []),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the summary's history included); `from_dict` reads it back."""
        return {
            "spec": self.spec.get_config(),
            "status": self.status,
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "cycle_time_ms": self.cycle_time_ms,
            "link": self.link.get_config(),
            "train_command": self.train_command,
            "fleet_command": self.fleet_command,
            "latency_emulated": self.latency_emulated,
            "run_seconds": self.run_seconds,
            "summary": self.summary,
            "accounting": self.accounting,
            "resources": {name: r.to_dict() for name, r in self.resources.items()},
            "faults": self.faults,
        }


def _print_progress(line: str) -> None:
    print(line, flush=True)


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


class ExperimentRunner:
    """Brings fleets up and down around the runs of a plan and collects what each run left.

    Example:
        >>> runner = ExperimentRunner(Path("results/experiments/devices"))
        >>> results = runner.run(DevicesExperiment(quick=True).plan())   # doctest: +SKIP

    """

    def __init__(
        self,
        out_dir: Path,
        *,
        state_dir: Path = DEFAULT_EXPERIMENT_STATE_DIR,
        prefix: str = DEFAULT_EXPERIMENT_PREFIX,
        subnet: str = DEFAULT_EXPERIMENT_SUBNET,
        profiles_file: Path = DEFAULT_PROFILES_PATH,
        refuse_if_up: Sequence[Path] = (DEFAULT_STATE_DIR,),
        metrics_port: int = DEFAULT_METRICS_PORT,
        scrape_interval_seconds: float = DEFAULT_SCRAPE_INTERVAL_SECONDS,
        progress: Progress = _print_progress,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.state_dir = Path(state_dir)
        self.prefix = prefix
        self.subnet = subnet
        self.profiles = load_profiles(profiles_file)
        self.refuse_if_up = [Path(path) for path in refuse_if_up]
        self.metrics_port = metrics_port
        self.scrape_interval_seconds = scrape_interval_seconds
        self.progress = progress

    # ------------------------------------------------------------------ checks

    def check_no_fleet_up(self) -> None:
        """Refuse (ValueError) while a fleet is up in our state dir or in a user's."""
        if Fleet(self.state_dir).state() is not None:
            raise ValueError(
                f"a fleet is already up in the experiments' state dir {self.state_dir} (an "
                "experiment that did not finish?); bring it down with `globaldl fleet down "
                f"--state-dir {self.state_dir}` and start again"
            )
        for state_dir in self.refuse_if_up:
            if state_dir != self.state_dir and Fleet(state_dir).state() is not None:
                raise ValueError(
                    f"a fleet is up in {state_dir}: its devices would compete for the same cores "
                    "and distort every timing; bring it down with `globaldl fleet down "
                    f"--state-dir {state_dir}` first"
                )

    def link_of(self, fleet: FleetConfig) -> LinkProfile:
        """The link profile a fleet config names (ValueError naming the valid ones)."""
        return device_profiles(self.profiles, devices=1, profile=fleet.profile)[0]

    def plan_fleet(self, fleet: FleetConfig) -> FleetPlan:
        """The fleet plan for a config, validated (CPU and memory must fit the machine)."""
        sites = (
            {"sites": fleet.sites, "lan": fleet.lan, "wan": fleet.profile} if fleet.sites else {}
        )
        return plan_from_options(
            self.profiles,
            devices=fleet.devices,
            profile=None if fleet.sites else fleet.profile,
            **sites,
            prefix=self.prefix,
            subnet=self.subnet,
            cpu_cores=fleet.cpu_cores_per_device if fleet.cpu_cores_each is None else None,
            memory_mb=fleet.memory_mb,
            cpu_cores_each=fleet.cpu_cores_each,
        )

    def cycle_time_ms(self, spec: RunSpec) -> float:
        """The run's HOROVOD_CYCLE_TIME: its own, or the link's automatic choice."""
        if spec.cycle_time_ms is not None:
            return spec.cycle_time_ms
        link = self.link_of(spec.fleet)
        return auto_cycle_time_ms(link.up_kbit_per_second, link.down_kbit_per_second)

    def validate(self, specs: Sequence[RunSpec]) -> None:
        """Check the whole plan before any fleet comes up: unique labels, fleets that fit."""
        if not specs:
            raise ValueError("the plan has no runs")
        labels = [spec.label for spec in specs]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"run labels must be unique; repeated: {duplicates}")
        for fleet in {spec.fleet for spec in specs}:
            self.plan_fleet(fleet)

    # -------------------------------------------------------------------- run

    def run(
        self, specs: Sequence[RunSpec], collected: list[RunResult] | None = None
    ) -> list[RunResult]:
        """Run every spec in order; adjacent specs with the same fleet share one fleet.

        Results are appended to `collected` (when given) as they come, so a caller still has
        the finished runs when a later one raises or the user interrupts.
        """
        self.validate(specs)
        self.check_no_fleet_up()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        results: list[RunResult] = collected if collected is not None else []
        total = len(specs)
        for fleet_config, group in itertools.groupby(specs, key=lambda spec: spec.fleet):
            group_specs = list(group)
            fleet = Fleet(self.state_dir)
            try:
                latency_emulated = self._up(fleet, fleet_config)
                for spec in group_specs:
                    result = self._run_one(spec, latency_emulated)
                    results.append(result)
                    self.progress(_progress_line(len(results), total, result))
            finally:
                fleet.down(log=self._fleet_log)
        return results

    def _fleet_log(self, line: str) -> None:
        with (self.out_dir / "fleet.log").open("a") as stream:
            stream.write(f"{datetime.now(timezone.utc).isoformat()} {line}\n")

    def _up(self, fleet: Fleet, config: FleetConfig) -> bool:
        self._fleet_log(
            "up: "
            + config.up_command(
                prefix=self.prefix, subnet=self.subnet, state_dir=str(self.state_dir)
            )
        )
        state = fleet.up(self.plan_fleet(config), latency="auto", log=self._fleet_log)
        return state.latency_emulated

    def _run_one(self, spec: RunSpec, latency_emulated: bool) -> RunResult:
        run_dir = self.out_dir / "runs" / spec.label
        run_dir.mkdir(parents=True, exist_ok=True)
        summary_path = (run_dir / "summary.json").resolve()
        run_id = slug(f"{spec.experiment}-{spec.label}-{_utc_stamp()}")
        cycle_time_ms = self.cycle_time_ms(spec)
        train_args = [*spec.train_args, "--run-id", run_id, "--summary", str(summary_path)]
        if spec.scrape_metrics:
            train_args += ["--metrics-port", str(self.metrics_port)]
        argv = [
            sys.executable,
            "-m",
            FLEET_RUN_MODULE,
            "run",
            "--state-dir",
            str(self.state_dir),
            "--timeout-seconds",
            f"{spec.timeout_seconds:g}",
            "--start-timeout-seconds",
            str(START_TIMEOUT_SECONDS),
        ]
        if spec.scrape_metrics:
            # Prometheus file-SD targets of the run go into the run's folder, not runs/.
            argv += ["--prometheus-dir", str(run_dir / "prometheus")]
        argv += [*spec.fleet_run_args, "--", *train_args]
        result = RunResult(
            spec=spec,
            status="running",
            run_id=run_id,
            run_dir=run_dir,
            cycle_time_ms=cycle_time_ms,
            link=self.link_of(spec.fleet),
            train_command=shlex.join(["globaldl", "train", *train_args]),
            fleet_command=(
                f"HOROVOD_CYCLE_TIME={cycle_time_ms:g} "
                + shlex.join(["globaldl", "fleet", *argv[argv.index("run") :]])
            ),
            latency_emulated=latency_emulated,
        )
        scraper = None
        if spec.scrape_metrics:
            fleet_state = Fleet(self.state_dir).require_state()
            scraper = ExporterScraper(
                {
                    device.name: f"http://{device.address}:{self.metrics_port}/metrics"
                    for device in fleet_state.devices
                },
                interval_seconds=self.scrape_interval_seconds,
            )
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
            if scraper is not None:
                scraper.start()
            faults = None
            if spec.faults:
                faults = FaultInjector(
                    spec.faults, log_path, Fleet(self.state_dir), self.prefix, process
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
                if scraper is not None:
                    scraper.stop()
                if faults is not None:
                    result.faults = faults.stop()
        result.run_seconds = time.monotonic() - started
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
        _write_json(run_dir / "result.json", result.to_dict())
        return result


class FaultInjector:
    """Kills and revives devices during a run when its output reaches the faults' triggers."""

    POLL_SECONDS = 0.2

    def __init__(
        self,
        faults: Sequence[Fault],
        log_path: Path,
        fleet: Fleet,
        prefix: str,
        process: subprocess.Popen[bytes],
    ) -> None:
        self.faults = list(faults)
        self.log_path = log_path
        self.fleet = fleet
        self.prefix = prefix
        self.process = process
        self.done: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def start(self) -> None:
        """Watch the run's output in the background."""
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        """Stop watching; return what was done: action, device, and unix times."""
        self._stop.set()
        self._thread.join(timeout=120)
        return self.done

    def _run(self) -> None:
        position = 0
        for fault in self.faults:
            pattern = re.compile(fault.after_line)
            while True:
                if self._stop.is_set() or self.process.poll() is not None:
                    return
                text = self.log_path.read_bytes()[position:].decode(errors="replace")
                match = pattern.search(text)
                if match:
                    position += len(text[: match.end()].encode())
                    break
                time.sleep(self.POLL_SECONDS)
            if self._stop.wait(fault.delay_seconds):
                return
            name = f"{self.prefix}-{fault.device}"
            record: dict[str, Any] = {"action": fault.action, "device": name, "at": time.time()}
            try:
                outcome = getattr(self.fleet, fault.action)(name)
                if outcome is not None:  # a measurement
                    record["result"] = outcome
            except Exception as error:  # recorded; the run's own outcome tells the rest
                record["error"] = str(error)
            record["done_at"] = time.time()
            self.done.append(record)


def load_results(out_dir: Path, specs: Sequence[RunSpec]) -> list[RunResult]:
    """The results a runner left in `out_dir` for `specs`, in plan order; missing runs skipped."""
    results = []
    for spec in specs:
        path = Path(out_dir) / "runs" / spec.label / "result.json"
        if path.exists():
            results.append(RunResult.from_dict(json.loads(path.read_text())))
    return results


def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")


def _write_json(path: Path, document: Any) -> None:
    from globaldl.summary import write_json_atomically

    write_json_atomically(path, document)


def _progress_line(index: int, total: int, result: RunResult) -> str:
    """`[3/12] devices lenet-n2-none: ok, 24 steps x 2 ranks, train 31.0 s, ...`."""
    head = f"[{index}/{total}] {result.spec.experiment} {result.spec.label}:"
    if not result.ok:
        return f"{head} {result.status} (log: {result.run_dir / 'fleet-run.log'})"
    summary = result.summary
    assert summary is not None
    step_seconds = mean_step_seconds(summary)
    step_text = f"{step_seconds:.3f} s" if step_seconds is not None else "n/a"
    return (
        f"{head} ok, {summary['steps']} steps x {summary['ranks']} ranks, train "
        f"{training_seconds(summary):.1f} s, step {step_text}, val_acc "
        f"{summary['val_accuracy']:.3f}, run {result.run_seconds:.0f} s, cycle "
        f"{result.cycle_time_ms:g} ms"
    )
