"""Run an experiment's plan on the emulated fleet, under the benchmark protocol.

The protocol (in the spirit of MLPerf's rules for a compared result):

* every run of the plan is repeated `repeats` times (>= 3 for results people compare),
  interleaved: repeat 1 of every run, then repeat 2, ... (globaldl/experiments/progress.py);
* the machine's load is recorded during every run: CPU used outside the fleet, by link
  emulation, by the experiment's own host processes, and the load average
  (globaldl/experiments/load.py); a run above the BusyLimits is marked busy, and the
  `busy_policy` decides: `mark` keeps it (marked), `refuse` keeps it out of the medians
  (status "refused: ..."), `rerun` waits for a quiet machine and runs it again (at most
  `max_reruns` times, then keeps it, marked);
* tables report the median of the repeats with its min-max, and targets are evaluated on
  the medians (globaldl/experiments/aggregate.py, experiment.py).

The API for experiments (kept stable for the experiments written on other branches): an
experiment's `plan()` returns the RunSpecs of ONE repeat, runs that share a fleet next to each
other; `ExperimentRunner.run(specs, repeats=N)` runs them N times and returns a RunResult per
run (with `repeat` and `load`); `run(specs)` alone runs them once, as before.

Each stretch of adjacent runs that need the same fleet shares one `fleet up`; the fleet
always comes down in a `finally`, also after Ctrl-C, a failed run or a timeout. Experiments
use their own state dir, name prefix and subnet, so they never touch a fleet a user brought
up, and refuse to start while any fleet is up (it would compete for the same cores).

Every run is `globaldl fleet run -- <train args>` in a child process (fleet_run.py: real
horovodrun over ssh into the namespaces), its output kept in the run's folder; the run summary
and the fleet's byte accounting are read back, and every device's exporter optionally scraped.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timezone
from pathlib import Path

from globaldl.experiments.analysis import mean_step_seconds, training_seconds
from globaldl.experiments.faults import FaultInjector
from globaldl.experiments.fleet_run import run_once, save_result
from globaldl.experiments.load import (
    BusyLimits,
    LoadSources,
    measure_load,
)
from globaldl.experiments.progress import RunClock, ScheduledRun, earlier_run_seconds, interleave
from globaldl.experiments.results import RunResult, load_results, portable, repeat_dir
from globaldl.experiments.spec import FleetConfig, RunSpec
from globaldl.fleet.cycle_time import auto_cycle_time_ms
from globaldl.fleet.fleet import Fleet, FleetLockTimeoutError
from globaldl.fleet.plan import FleetPlan, plan_from_options
from globaldl.fleet.profiles import (
    DEFAULT_PROFILES_PATH,
    LinkProfile,
    device_profiles,
    load_profiles,
)
from globaldl.fleet.state import DEFAULT_STATE_DIR

__all__ = [
    "BUSY_POLICIES",
    "ExperimentRunner",
    "FaultInjector",
    "RunResult",
    "load_results",
]

DEFAULT_EXPERIMENT_STATE_DIR = Path("/run/globaldl-experiments")
DEFAULT_EXPERIMENT_PREFIX = "gdlx"
DEFAULT_EXPERIMENT_SUBNET = "10.78.0.0/24"
DEFAULT_METRICS_PORT = 19500
DEFAULT_SCRAPE_INTERVAL_SECONDS = 1.0
BUSY_POLICIES = ("mark", "refuse", "rerun")
DEFAULT_MAX_RERUNS = 2
# Another fleet's operation may hold the lock the fleets share for minutes on a busy machine.
DOWN_ATTEMPTS = 5
# Before a re-run: how long one look at the machine lasts, and how long to wait for quiet.
QUIET_CHECK_SECONDS = 10.0
QUIET_WAIT_SECONDS = 900.0

Progress = Callable[[str], None]


def _print_progress(line: str) -> None:
    print(line, flush=True)


class ExperimentRunner:
    """Brings fleets up and down around the runs of a plan and collects what each run left.

    Example:
        >>> runner = ExperimentRunner(Path("results/experiments/devices"), busy_policy="rerun")
        >>> results = runner.run(DevicesExperiment().plan(), repeats=3)   # doctest: +SKIP

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
        busy_policy: str = "mark",
        busy_limits: BusyLimits | None = None,
        max_reruns: int = DEFAULT_MAX_RERUNS,
    ) -> None:
        if busy_policy not in BUSY_POLICIES:
            raise ValueError(
                f"busy policy {busy_policy!r} is not one of: {', '.join(BUSY_POLICIES)}"
            )
        if isinstance(max_reruns, bool) or not isinstance(max_reruns, int) or max_reruns < 0:
            raise ValueError(f"max_reruns must be a whole number >= 0, got {max_reruns!r}")
        self.out_dir = Path(out_dir)
        self.state_dir = Path(state_dir)
        self.prefix = prefix
        self.subnet = subnet
        self.profiles = load_profiles(profiles_file)
        self.refuse_if_up = [Path(path) for path in refuse_if_up]
        self.metrics_port = metrics_port
        self.scrape_interval_seconds = scrape_interval_seconds
        self.progress = progress
        self.busy_policy = busy_policy
        self.busy_limits = busy_limits or BusyLimits()
        self.max_reruns = max_reruns

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
        self,
        specs: Sequence[RunSpec],
        collected: list[RunResult] | None = None,
        *,
        repeats: int = 1,
        earlier: Sequence[RunResult] = (),
        done: Collection[tuple[str, int]] = (),
    ) -> list[RunResult]:
        """Run every spec `repeats` times, interleaved; adjacent runs on one fleet share it.

        Results are appended to `collected` (when given) as they come, so a caller still has
        the finished runs when a later one raises or the user interrupts. A label that runs
        replaces its earlier results in `out_dir/runs/`, except the repeats in `done` (label,
        repeat): those are recorded already and neither run nor removed (a resumed
        experiment). `earlier` results (e.g. of an earlier session) only seed the time
        estimate.
        """
        schedule = interleave(specs, repeats, done)
        self.validate(specs)
        self.check_no_fleet_up()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed_labels = {label for label, _ in done}
        for spec in specs:
            if spec.label not in resumed_labels:
                shutil.rmtree(self.out_dir / "runs" / spec.label, ignore_errors=True)
        for scheduled in schedule:
            shutil.rmtree(
                repeat_dir(self.out_dir, scheduled.spec.label, scheduled.repeat),
                ignore_errors=True,
            )
        results: list[RunResult] = collected if collected is not None else []
        clock = RunClock(schedule, earlier_run_seconds(earlier, specs))
        resumed = f", {len(done)} recorded already" if done else ""
        self.progress(
            f"{len(schedule)} runs ({len(specs)} x {repeats} repeats, interleaved{resumed}); "
            + clock.eta_text(schedule)
        )
        position = 0
        for fleet_config, stretch in itertools.groupby(schedule, key=lambda run: run.spec.fleet):
            group = list(stretch)
            fleet = Fleet(self.state_dir)
            try:
                started = time.monotonic()
                latency_emulated = self._up(fleet, fleet_config)
                clock.fleet_up(time.monotonic() - started)
                sources = self._load_sources()
                for scheduled in group:
                    position += 1
                    self.progress(
                        f"{clock.position(scheduled)}: starting; "
                        + clock.eta_text(schedule[position - 1 :])
                    )
                    result = self._run_under_policy(scheduled, latency_emulated, sources)
                    results.append(result)
                    clock.finished(scheduled, result.run_seconds or 0.0)
                    self.progress(_progress_line(clock.position(scheduled), result))
            finally:
                self._down(fleet)
        return results

    def _down(self, fleet: Fleet) -> None:
        """Bring the fleet down, waiting out other fleets' operations on the shared lock."""
        for attempt in range(1, DOWN_ATTEMPTS + 1):
            try:
                fleet.down(log=self._fleet_log)
                return
            except FleetLockTimeoutError as error:
                if attempt == DOWN_ATTEMPTS:
                    raise
                self.progress(f"  fleet down waits: {error}; trying again ({attempt})")

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

    def _load_sources(self) -> LoadSources:
        """The fleet's CPU accounting, with a group for our own `fleet run` processes."""
        sources = LoadSources.for_fleet(self.prefix)
        if sources.launcher_group is not None and sources.fleet_group is not None:
            if sources.fleet_group.exists():
                # Removed with the fleet's group at `fleet down` (it removes child groups).
                sources.launcher_group.mkdir(exist_ok=True)
            else:
                sources.launcher_group = None
        return sources

    def _run_under_policy(
        self, scheduled: ScheduledRun, latency_emulated: bool, sources: LoadSources
    ) -> RunResult:
        """Run once; on a busy machine mark, refuse or re-run it as the busy policy says."""
        reruns = 0
        while True:
            result = self._run_one(scheduled, latency_emulated, sources)
            result.reruns = reruns
            if not result.machine_busy:
                return result
            assert result.load is not None
            if self.busy_policy == "refuse":
                result.status = f"refused: machine busy ({result.load.busy_reason})"
                save_result(result)
                return result
            if self.busy_policy == "mark" or reruns >= self.max_reruns:
                return result
            reruns += 1
            log = result.run_dir / "fleet-run.log"
            if log.exists():
                log.rename(result.run_dir / f"fleet-run.busy-{reruns}.log")
            self.progress(
                f"  machine busy ({result.load.busy_reason}); waiting for quiet, then running "
                f"it again ({reruns} of at most {self.max_reruns})"
            )
            self._wait_for_quiet(sources)

    def _wait_for_quiet(self, sources: LoadSources) -> None:
        deadline = time.monotonic() + QUIET_WAIT_SECONDS
        while True:
            load = measure_load(sources, QUIET_CHECK_SECONDS, self.busy_limits)
            if not load.busy or time.monotonic() > deadline:
                self.progress(f"  {load.text()}")
                return

    def _run_one(
        self, scheduled: ScheduledRun, latency_emulated: bool, sources: LoadSources
    ) -> RunResult:
        return run_once(self, scheduled, latency_emulated, sources)


def _progress_line(position: str, result: RunResult) -> str:
    """`[3/24] devices lenet-n2-none (repeat 1/3): ok, 24 steps x 2 ranks, ..., load ...`."""
    head = f"{position}:"
    load = f"; {result.load.text()}" if result.load is not None else ""
    if not result.ok:
        return f"{head} {result.status} (log: {portable(str(result.run_dir / 'fleet-run.log'))})"
    summary = result.summary
    assert summary is not None
    step_seconds = mean_step_seconds(summary)
    step_text = f"{step_seconds:.3f} s" if step_seconds is not None else "n/a"
    return (
        f"{head} ok, {summary['steps']} steps x {summary['ranks']} ranks, train "
        f"{training_seconds(summary):.1f} s, step {step_text}, val_acc "
        f"{summary['val_accuracy']:.3f}, run {result.run_seconds:.0f} s, cycle "
        f"{result.cycle_time_ms:g} ms{load}"
    )
