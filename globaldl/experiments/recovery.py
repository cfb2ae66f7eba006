"""`recovery`: how long an elastic run needs to go on after a device dies, and to take it back.

Three devices train under Horovod Elastic (`fleet run --elastic --min-np 2`). Once the run is a
few seconds into its second epoch, `globaldl fleet kill` kills device 3's processes and takes
its link down; at the start of the fourth epoch `globaldl fleet revive` brings it back and the
discovery script lists it again. The run summary's `elastic.events` hold when each worker saw
the change and when its next step completed; with the fault times recorded by the runner:

* death -> next step: from the kill to the survivors' first completed step after the reset.
  The survivors notice a device that vanished without closing its connections only when
  Gloo's wait for it times out (HOROVOD_GLOO_TIMEOUT_SECONDS, 45 s here; Horovod's default is
  30 s), so that timeout is most of it. The same timeout bounds the wait for a joining worker
  to reach the rendezvous, so it cannot be shorter than a worker's start-up.
* join -> first step: from the revive (device up and reachable again) to the first step of
  the re-formed ring with the new device, which must start Python and TensorFlow first.

An uninterrupted elastic run on the same fleet gives the accuracy to compare with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from globaldl.elastic_timeouts import COLLECTIVE_TIMEOUT_ENV
from globaldl.experiments.analysis import TargetCheck
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import number_or_none, save_figure
from globaldl.experiments.runner import RunResult
from globaldl.experiments.spec import (
    LENET_MNIST,
    Fault,
    FleetConfig,
    RunSpec,
    compression_args,
    slug,
)

# Bounds both how long survivors wait for a silent peer and how long a re-forming ring waits
# for a joining worker, which must first start Python and TensorFlow on its small CPU share
# (~20 s at 0.5 core; at 10 s the ring gave up on the revived device and every worker aborted).
GLOO_TIMEOUT_SECONDS = 45
COMMIT_EVERY = 10
COMPRESSION = "prune+quantize"


def recovery_seconds(result: RunResult) -> dict[str, float | None]:
    """Seconds from each fault to the next completed step (None when it never came)."""
    summary = result.summary or {}
    events = (summary.get("elastic") or {}).get("events", [])
    measured: dict[str, float | None] = {}
    for fault in result.faults:
        # A kill shows as a failure reset, a revive as a hosts_changed reset, after the fault.
        wanted = "failure" if fault["action"] == "kill" else "hosts_changed"
        reference = fault["at"] if fault["action"] == "kill" else fault["done_at"]
        after = [
            event
            for event in events
            if event["reason"] == wanted
            and event["detected_at"] >= fault["at"]
            and event.get("first_step_at") is not None
        ]
        measured[fault["action"]] = (
            min(event["first_step_at"] for event in after) - reference if after else None
        )
        if fault["action"] == "kill":
            measured["detect"] = (
                min(event["detected_at"] for event in after) - fault["at"] if after else None
            )
    return measured


class RecoveryExperiment(Experiment):
    """Seconds from a device's death to the next step, and from its return to its first step."""

    name = "recovery"
    title = "Elastic recovery: a device dies and comes back"
    columns = (
        "scenario",
        "devices",
        "profile",
        "sizes",
        "lost_steps",
        "seconds_kill_to_detect",
        "seconds_kill_to_next_step",
        "seconds_revive_to_first_step",
        "val_accuracy",
        "training_seconds",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        profile: str = "lte",
        repeats: int | None = None,
        epochs: int | None = None,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.profile = profile
        self.repeats = repeats or (1 if quick else 2)
        self.epochs = epochs or (4 if quick else 6)
        if self.epochs < 4:
            raise ValueError(
                f"recovery needs at least 4 epochs (kill in 2, revive at 4), got {self.epochs}"
            )
        self.fleet = FleetConfig(3, profile, 0.5)

    def plan(self) -> list[RunSpec]:
        """An uninterrupted elastic run, then `repeats` runs with a kill and a revive."""
        args = (
            *LENET_MNIST.train_args,
            "--epochs",
            str(self.epochs),
            "--commit-every",
            str(COMMIT_EVERY),
            *compression_args(COMPRESSION),
            "--seed",
            "0",
        )
        common: dict[str, Any] = {
            "experiment": self.name,
            "fleet": self.fleet,
            "train_args": args,
            "cycle_time_ms": self.cycle_time_ms,
            "fleet_run_args": ("--elastic", "--min-np", "2", "--elastic-timeout-seconds", "120"),
            # One timeout for joins and collectives alike (no re-formation under a shorter
            # one): the single-timeout baseline the `chaos` experiment's two timeouts improve on.
            "env": {
                "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_SECONDS),
                COLLECTIVE_TIMEOUT_ENV: str(GLOO_TIMEOUT_SECONDS),
            },
            "timeout_seconds": 900.0,
        }
        specs = [RunSpec(label="uninterrupted", factors={"scenario": "uninterrupted"}, **common)]
        faults = (
            Fault("kill", 3, r"epoch 1/", delay_seconds=3.0),
            Fault("revive", 3, r"epoch 3/", delay_seconds=5.0),
        )
        for repeat in range(1, self.repeats + 1):
            specs.append(
                RunSpec(
                    label=slug(f"kill-revive-{repeat}"),
                    factors={"scenario": f"kill device 3, revive it ({repeat})"},
                    faults=faults,
                    **common,
                )
            )
        return specs

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run: sizes over the run, lost steps, and the recovery times."""
        rows = []
        for result in results:
            row = run_row(result)
            elastic = (result.summary or {}).get("elastic") or {}
            row["sizes"] = "->".join(str(size) for size in elastic.get("sizes", []))
            row["lost_steps"] = elastic.get("lost_steps")
            seconds = recovery_seconds(result)
            row["seconds_kill_to_detect"] = seconds.get("detect")
            row["seconds_kill_to_next_step"] = seconds.get("kill")
            row["seconds_revive_to_first_step"] = seconds.get("revive")
            row["faults"] = result.faults
            rows.append(row)
        return rows

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """Every interrupted run lost at most K steps and ended within 1 point of uninterrupted."""
        reference = next((r for r in rows if r["label"] == "uninterrupted"), {})
        checks = []
        for row in rows:
            if row["label"] == "uninterrupted":
                continue
            lost = row.get("lost_steps")
            checks.append(
                TargetCheck(
                    f"{row['label']}: at most {COMMIT_EVERY} steps lost (commit every "
                    f"{COMMIT_EVERY})",
                    f"{lost} steps lost, sizes {row.get('sizes')}",
                    None if lost is None else lost <= COMMIT_EVERY,
                )
            )
            accuracy, baseline = row.get("val_accuracy"), reference.get("val_accuracy")
            checks.append(
                TargetCheck(
                    f"{row['label']}: final val_accuracy at most 1 point below the uninterrupted "
                    "run",
                    f"{accuracy} vs {baseline}",
                    None if accuracy is None or baseline is None else accuracy >= baseline - 0.01,
                )
            )
        return checks

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """Bars: seconds from kill to detection and to the next step, and from revive to step."""
        measured = [row for row in rows if row["label"] != "uninterrupted"]
        if not measured:
            return []
        keys = (
            ("seconds_kill_to_detect", "kill -> detected"),
            ("seconds_kill_to_next_step", "kill -> next step"),
            ("seconds_revive_to_first_step", "revive -> first step"),
        )

        def draw(figure: Any) -> None:
            axes = figure.add_subplot(1, 1, 1)
            width = 0.8 / len(measured)
            for index, row in enumerate(measured):
                values = [number_or_none(row.get(key)) or 0.0 for key, _ in keys]
                positions = [k + index * width for k in range(len(keys))]
                axes.bar(positions, values, width=width, label=row["label"])
            axes.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
            axes.set_xticklabels([label for _, label in keys])
            axes.set_ylabel("seconds")
            axes.set_title(
                f"Elastic recovery, 3 devices on {self.profile} "
                f"(Gloo timeout {GLOO_TIMEOUT_SECONDS} s)"
            )
            axes.legend()

        return [save_figure(out_dir / "recovery.png", draw)]

    def method(self) -> str:
        """How the runs are built."""
        return (
            f"3 devices ({self.profile}, 0.5 core each) train LeNet on MNIST with {COMPRESSION} "
            f"under `globaldl fleet run --elastic --min-np 2` for {self.epochs} epochs, committing "
            f"every {COMMIT_EVERY} steps, HOROVOD_GLOO_TIMEOUT_SECONDS={GLOO_TIMEOUT_SECONDS}. "
            "In the kill-revive runs, `globaldl fleet kill` hits device 3 three seconds into "
            "epoch 2 (its processes killed, its link down: it vanishes without closing its "
            "connections) and `globaldl fleet revive` brings it back five seconds into epoch 4 "
            "(after Horovod's blacklist cooldown of at most 10 s). "
            "Times come from the runner's fault times and the summary's `elastic.events` (every "
            "worker's clock is this machine's)."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "profile": self.profile,
            "repeats": self.repeats,
            "epochs": self.epochs,
        }
