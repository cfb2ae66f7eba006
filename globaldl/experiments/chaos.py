"""`chaos`: random kills and revives under Horovod Elastic with compression, and what they cost.

Four devices train LeNet/MNIST with top-k 1% + int8 under `fleet run --elastic --min-np 2`,
on lte's rates without its delay (`custom:5:17.5`, the default profile): with lte's 35 ms each
way the first epoch of one stopped run took 87.5 s (99% exchange; not a benchmark figure), so
one repeat of 7 trials would take about 1.8 hours (estimate); what a kill costs is set by
the Gloo timeouts, not by the link.
Seeded random trials (chaos_trials.py) each kill one of devices 2-4 (`fleet kill`: processes
killed, link down, so it vanishes without closing a connection) once the ring trains at full
size, and revive it once the survivors train again. The trials are spread over several runs
(an elastic run of a few hundred steps per trial), next to one undisturbed run of the same
length. Workers use the two Gloo timeouts of globaldl/elastic_timeouts.py: rings form under
the join timeout (a revived device starts TensorFlow on half a core) and train under the
collective timeout, which bounds how long survivors wait for a device that vanished.

Reported per trial (NAME-trials.csv) and per run: hangs (a kill after which no step came and
the run did not finish), steps lost per failure, seconds from the kill to the survivors' next
step, seconds from the revive to the grown ring's first step, the final accuracy against the
undisturbed run, and compute utilisation: the share of rank 0's wall time spent in the
forward/backward pass (re-run steps count as compute: they are work done).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from globaldl.elastic_timeouts import COLLECTIVE_TIMEOUT_ENV, JOIN_TIMEOUT_ENV
from globaldl.experiments.analysis import TargetCheck
from globaldl.experiments.chaos_trials import (
    TrialMeasurement,
    compute_utilisation,
    measure_trials,
    split_trials,
    step_utilisation,
    trial_faults,
    trial_schedule,
)
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import save_figure, write_csv
from globaldl.experiments.runner import RunResult
from globaldl.experiments.spec import LENET_MNIST, FleetConfig, RunSpec, compression_args

DEVICES = 4
DEFAULT_PROFILE = "custom:5:17.5"  # lte's rates (up 5, down 17.5 Mbit/s), no delay
COMMIT_EVERY = 10
COMPRESSION = "prune+quantize"
JOIN_TIMEOUT_SECONDS = 60
COLLECTIVE_TIMEOUT_SECONDS = 10
MAX_SECONDS_KILL_TO_NEXT_STEP = 30.0
MAX_ACCURACY_LOSS = 0.01
MIN_TRIALS = 20
# Epochs a trial needs: the ring trains during the kill delay (5-25 s) and the revive delay
# (3-15 s), at most 40 s per trial, and stalls the rest (detection, re-formation, the joiner's
# start-up); an epoch of LeNet on 4 half-core devices takes ~8-12 s (a one-trial smoke).
# Two more epochs before the first kill and after the last revive.
EPOCHS_PER_TRIAL = 5
EPOCHS_AROUND_TRIALS = 2


class ChaosExperiment(Experiment):
    """Seeded random kills and revives on an elastic, compressed fleet: hangs, losses, time."""

    name = "chaos"
    title = "Chaos: random kills and revives under Horovod Elastic"
    columns = (
        "scenario",
        "trials",
        "hangs",
        "max_lost_steps",
        "median_seconds_kill_to_next_step",
        "max_seconds_kill_to_next_step",
        "median_seconds_revive_to_first_step",
        "val_accuracy",
        "compute_utilisation",
        "step_utilisation",
        "training_seconds",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        profile: str = DEFAULT_PROFILE,
        trials: int | None = None,
        trials_per_run: int = 5,
        seed: int = 0,
        collective_timeout_seconds: int = COLLECTIVE_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.profile = profile
        self.trials = trials or (2 if quick else MIN_TRIALS)
        self.trials_per_run = trials_per_run
        self.seed = seed
        if not 1 <= collective_timeout_seconds < JOIN_TIMEOUT_SECONDS:
            raise ValueError(
                f"collective timeout must be 1..{JOIN_TIMEOUT_SECONDS - 1} s (below the join "
                f"timeout), got {collective_timeout_seconds}"
            )
        self.collective_timeout_seconds = collective_timeout_seconds
        self.schedule = trial_schedule(self.trials, DEVICES, seed)
        self.runs = split_trials(self.schedule, trials_per_run)
        self.epochs = EPOCHS_AROUND_TRIALS + EPOCHS_PER_TRIAL * max(len(r) for r in self.runs)
        self.fleet = FleetConfig(DEVICES, profile, 0.5)

    def plan(self) -> list[RunSpec]:
        """One undisturbed elastic run, then the trials in runs of `trials_per_run`."""
        common: dict[str, Any] = {
            "experiment": self.name,
            "fleet": self.fleet,
            "train_args": (
                *LENET_MNIST.train_args,
                "--epochs",
                str(self.epochs),
                "--commit-every",
                str(COMMIT_EVERY),
                *compression_args(COMPRESSION),
                "--seed",
                "0",
            ),
            "cycle_time_ms": self.cycle_time_ms,
            "fleet_run_args": ("--elastic", "--min-np", "2", "--elastic-timeout-seconds", "120"),
            "env": {
                JOIN_TIMEOUT_ENV: str(JOIN_TIMEOUT_SECONDS),
                COLLECTIVE_TIMEOUT_ENV: str(self.collective_timeout_seconds),
            },
            # An epoch takes well under a minute; the rest is a generous bound for recoveries.
            "timeout_seconds": 120.0 * self.epochs + 600.0,
        }
        specs = [RunSpec(label="undisturbed", factors={"scenario": "undisturbed"}, **common)]
        first = 1
        for index, trials in enumerate(self.runs, start=1):
            last = first + len(trials) - 1
            specs.append(
                RunSpec(
                    label=f"chaos-{index}",
                    factors={"scenario": f"trials {first}-{last} (seed {self.seed})"},
                    faults=trial_faults(trials, DEVICES),
                    **common,
                )
            )
            first = last + 1
        return specs

    def trial_measurements(self, result: RunResult) -> list[TrialMeasurement]:
        """The trials of one run, measured from its fault times and elastic events."""
        events = ((result.summary or {}).get("elastic") or {}).get("events", [])
        return measure_trials(result.faults, events, run_finished=result.ok)

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run: its trials summarised, its accuracy and compute utilisation."""
        rows = []
        for result in results:
            row = run_row(result)
            trials = self.trial_measurements(result)
            to_step = [t.seconds_kill_to_next_step for t in trials]
            to_join = [t.seconds_revive_to_first_step for t in trials]
            lost = [t.lost_steps for t in trials if t.lost_steps is not None]
            row["trials"] = len(trials)
            row["hangs"] = sum(t.hang for t in trials) + (
                1 if result.status.startswith("timed out") and not any(t.hang for t in trials)
                else 0
            )  # fmt: skip
            row["max_lost_steps"] = max(lost) if lost else None
            row["median_seconds_kill_to_next_step"] = _median(to_step)
            row["max_seconds_kill_to_next_step"] = _maximum(to_step)
            row["kills_without_next_step"] = sum(value is None for value in to_step)
            row["median_seconds_revive_to_first_step"] = _median(to_join)
            run_summary = result.summary or {}
            row["compute_utilisation"] = compute_utilisation(run_summary)
            row["step_utilisation"] = step_utilisation(run_summary)
            row["faults"] = result.faults
            rows.append(row)
        return rows

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """Trials run, no hang, losses within a commit, detection within 30 s, accuracy kept."""
        trials = [t for r in results if r.spec.faults for t in self.trial_measurements(r)]
        chaos_runs = [r for r in results if r.spec.faults]
        hangs = sum(t.hang for t in trials) + sum(
            r.status.startswith("timed out") for r in chaos_runs
        )
        failed = [r.spec.label for r in chaos_runs if not r.ok]
        lost = [t.lost_steps for t in trials if t.lost_steps is not None]
        to_step = [t.seconds_kill_to_next_step for t in trials]
        measured_steps = [value for value in to_step if value is not None]
        reference = next((row for row in rows if row["label"] == "undisturbed"), {})
        baseline = reference.get("val_accuracy")
        accuracies = {
            row["label"]: row.get("val_accuracy") for row in rows if row["label"] != "undisturbed"
        }
        low = {label: value for label, value in accuracies.items() if value is not None}
        # Every repeat runs the whole schedule again: the kills count over all repeats.
        repeats = len({r.repeat for r in chaos_runs}) or 1
        planned = len(self.schedule) * repeats
        return [
            TargetCheck(
                f"at least {MIN_TRIALS} kill/revive trials done",
                f"{len(trials)} kills done of {planned} planned ({len(self.schedule)} per "
                f"repeat x {repeats} repeat{'s' if repeats > 1 else ''})",
                len(trials) >= MIN_TRIALS,
            ),
            TargetCheck(
                "no hang (every kill followed by a step, or the run finished)",
                f"{hangs} hangs; runs not finished: {', '.join(failed) or 'none'}",
                (hangs == 0 and not failed) if chaos_runs else None,
            ),
            TargetCheck(
                f"steps lost per failure <= commit interval ({COMMIT_EVERY})",
                f"max {max(lost)} over {len(lost)} failures" if lost else "no failure measured",
                max(lost) <= COMMIT_EVERY if lost else None,
            ),
            TargetCheck(
                f"survivors' next step within {MAX_SECONDS_KILL_TO_NEXT_STEP:g} s of every kill",
                (
                    f"median {statistics.median(measured_steps):.1f} s, max "
                    f"{max(measured_steps):.1f} s over {len(measured_steps)} kills; "
                    f"{len(to_step) - len(measured_steps)} kills without a next step"
                )
                if measured_steps
                else "no kill measured",
                (
                    len(measured_steps) == len(to_step)
                    and max(measured_steps) <= MAX_SECONDS_KILL_TO_NEXT_STEP
                )
                if measured_steps
                else None,
            ),
            TargetCheck(
                "final val_accuracy of every chaos run at most 1 point below the undisturbed run",
                f"{', '.join(f'{k} {v:.3f}' for k, v in low.items()) or 'none'} vs {baseline}",
                (
                    all(value >= baseline - MAX_ACCURACY_LOSS for value in low.values())
                    and len(low) == len(accuracies)
                )
                if baseline is not None and low
                else None,
            ),
        ]

    def extra_outputs(self, results: Sequence[RunResult], out_dir: Path) -> list[Path]:
        """NAME-trials.csv: every trial's measurements, with its run and repeat."""
        trial_rows = [
            {"label": r.spec.label, "repeat": r.repeat, "trial": index, **t.as_row()}
            for r in results
            for index, t in enumerate(self.trial_measurements(r), start=1)
        ]
        return [write_csv(out_dir / f"{self.name}-trials.csv", trial_rows)]

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """Seconds from each kill to the survivors' next step, with the 30 s target."""
        trials = [t for r in results if r.spec.faults for t in self.trial_measurements(r)]
        if not trials:
            return []

        def draw(figure: Any) -> None:
            axes = figure.add_subplot(1, 1, 1)
            numbers = list(range(1, len(trials) + 1))
            to_step = [t.seconds_kill_to_next_step for t in trials]
            axes.bar(numbers, [value or 0.0 for value in to_step], label="kill -> next step")
            axes.scatter(
                numbers,
                [t.seconds_kill_to_detect or 0.0 for t in trials],
                color="black",
                marker="_",
                s=200,
                label="kill -> detected",
            )
            for number, value in zip(numbers, to_step, strict=True):
                if value is None:
                    axes.annotate("no step", (number, 0.5), ha="center", rotation=90)
            axes.axhline(MAX_SECONDS_KILL_TO_NEXT_STEP, color="red", linestyle="--", label="target")
            axes.set_xlabel("trial")
            axes.set_ylabel("seconds")
            axes.set_title(
                f"Chaos: {len(trials)} kills on {DEVICES} devices ({self.profile}), Gloo timeouts "
                f"{JOIN_TIMEOUT_SECONDS} s join / {self.collective_timeout_seconds} s collective"
            )
            axes.legend()

        return [save_figure(out_dir / "chaos.png", draw)]

    def method(self) -> str:
        """How the runs are built."""
        return (
            f"{DEVICES} devices ({self.profile}, 0.5 core each) train LeNet on MNIST with "
            f"{COMPRESSION} under `globaldl fleet run --elastic --min-np 2` for {self.epochs} "
            f"epochs, committing every {COMMIT_EVERY} steps, with "
            f"{JOIN_TIMEOUT_ENV}={JOIN_TIMEOUT_SECONDS} and "
            f"{COLLECTIVE_TIMEOUT_ENV}={self.collective_timeout_seconds}. {self.trials} trials "
            f"(seed {self.seed}) in runs of {self.trials_per_run}: each kills one of devices "
            f"2-{DEVICES} (`globaldl fleet kill`: processes killed, link down) 5-25 s after the "
            "ring trains at full size (the first after epoch 1), and revives it 3-15 s after "
            "the survivors' ring formed. Device 1 is never killed, so the worker that ends as "
            "rank 0 has been in every ring and its summary holds every membership change "
            "(Horovod's first ranks follow a set's order: rank 0 may start on another device, "
            "and a trial may kill it). Times come from the runner's fault "
            "times and the summary's `elastic.events` (one clock: this machine's). Compute "
            "utilisation is rank 0's forward/backward seconds over its wall seconds, step "
            "utilisation its seconds inside training steps (the exchange too) over its wall "
            "seconds. `chaos-trials.csv` splits each kill's cost into detection (the collective "
            "timeout) and re-formation (`seconds_detect_to_next_step`)."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "profile": self.profile,
            "trials": self.trials,
            "trials_per_run": self.trials_per_run,
            "seed": self.seed,
            "collective_timeout_seconds": self.collective_timeout_seconds,
            "epochs": self.epochs,
            "schedule": [dict(trial.__dict__) for trial in self.schedule],
        }


def _median(values: Sequence[float | None]) -> float | None:
    numbers = [value for value in values if value is not None]
    return statistics.median(numbers) if numbers else None


def _maximum(values: Sequence[float | None]) -> float | None:
    numbers = [value for value in values if value is not None]
    return max(numbers) if numbers else None
