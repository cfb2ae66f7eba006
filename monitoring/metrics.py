"""The training metrics every worker exports: defined once here, observed by the trainer."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from globaldl import __version__
from globaldl.monitoring.phases import PHASES, check_phase_seconds

LABEL_NAMES: tuple[str, ...] = ("run", "rank", "device")
"""Labels on every globaldl series: the run id, the Horovod rank and the device (host) name."""

STEP_SECONDS_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Histogram buckets for step and phase durations: from sub-millisecond phases on a fast host
to a minute-long step of a large model on a small device."""

GRADIENT_BYTE_KINDS: tuple[str, ...] = ("raw", "wire")
"""`raw`: bytes if every gradient went dense in fp32; `wire`: bytes handed to the exchange."""

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def check_run_id(run_id: str) -> str:
    """Return `run_id` if it is a usable label value and file name, else raise ValueError."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r} is not allowed; use 1-128 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit"
        )
    return run_id


def check_device(device: str) -> str:
    """Return `device` if it is a non-empty printable name of at most 128 characters."""
    if not isinstance(device, str) or not device or len(device) > 128 or not device.isprintable():
        raise ValueError(f"device name {device!r} is not allowed; use 1-128 printable characters")
    return device


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} is {value!r}; expected an integer >= 0")
    return value


class TrainingMetrics:
    """The training metrics of one worker, registered in `registry` and bound to its labels.

    Every child series is bound once here, so an observation is a dictionary lookup and a
    lock-protected add: a step never waits for a scrape, and a scrape never holds a lock for
    longer than it takes to copy one value.
    """

    def __init__(self, registry: CollectorRegistry, *, run_id: str, rank: int, device: str) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank is {rank!r}; expected an integer >= 0")
        self.label_values: tuple[str, ...] = (check_run_id(run_id), str(rank), check_device(device))
        labels = self.label_values
        phase_seconds = Histogram(
            "globaldl_step_phase_seconds",
            "Seconds one training step spent in each phase.",
            [*LABEL_NAMES, "phase"],
            buckets=STEP_SECONDS_BUCKETS,
            registry=registry,
        )
        self._phase_seconds = {phase: phase_seconds.labels(*labels, phase) for phase in PHASES}
        # Set once, by the first step (the series appear then, not as a false 0).
        self._first_step_seconds: Gauge | None = Gauge(
            "globaldl_first_step_phase_seconds",
            "Seconds this worker's first step spent in each phase (also in "
            "globaldl_step_phase_seconds): it traces the step and waits for Horovod's first "
            "negotiation; subtract it for the steady steps.",
            [*LABEL_NAMES, "phase"],
            registry=registry,
        )
        # A round end's seconds, reported with the step that follows it (see observe_round).
        self._round_seconds = dict.fromkeys(PHASES, 0.0)
        self._step_seconds = Histogram(
            "globaldl_step_seconds",
            "Seconds of one training step: the sum of its phases.",
            LABEL_NAMES,
            buckets=STEP_SECONDS_BUCKETS,
            registry=registry,
        ).labels(*labels)
        self._steps = Counter(
            "globaldl_steps_total",
            "Training steps run, skipped ones included.",
            LABEL_NAMES,
            registry=registry,
        ).labels(*labels)
        self._skipped_steps = Counter(
            "globaldl_skipped_steps_total",
            "Training steps whose update was skipped (non-finite gradients on some rank).",
            LABEL_NAMES,
            registry=registry,
        ).labels(*labels)
        self._rounds = Counter(
            "globaldl_rounds_total",
            "Rounds of local steps whose model-delta exchange completed (--sync-every > 1), "
            "skipped ones included.",
            LABEL_NAMES,
            registry=registry,
        ).labels(*labels)
        self._skipped_rounds = Counter(
            "globaldl_skipped_rounds_total",
            "Rounds skipped on every rank because some rank's model delta was not finite.",
            LABEL_NAMES,
            registry=registry,
        ).labels(*labels)
        self._examples = Counter(
            "globaldl_examples_total",
            "Training examples processed by this rank.",
            LABEL_NAMES,
            registry=registry,
        ).labels(*labels)
        gradient_bytes = Counter(
            "globaldl_gradient_bytes_total",
            "Gradient bytes summed over the run: raw = dense fp32, wire = sent to the exchange.",
            [*LABEL_NAMES, "kind"],
            registry=registry,
        )
        self._gradient_bytes_raw = gradient_bytes.labels(*labels, "raw")
        self._gradient_bytes_wire = gradient_bytes.labels(*labels, "wire")
        self._epoch = Gauge(
            "globaldl_epoch",
            "The last epoch this rank completed (0 before the first).",
            LABEL_NAMES,
            registry=registry,
        ).labels(*labels)
        self._epoch.set(0)
        # The loss and validation series appear with their first value, not as a false 0.
        self._loss = Gauge(
            "globaldl_loss",
            "Training loss of the latest step on this rank.",
            LABEL_NAMES,
            registry=registry,
        )
        self._loss_child: Gauge | None = None
        self._last_step_time = Gauge(
            "globaldl_last_step_timestamp_seconds",
            "Unix time at which this rank's latest step was observed.",
            LABEL_NAMES,
            registry=registry,
        )
        self._last_step_time_child: Gauge | None = None
        self._validation_loss = Gauge(
            "globaldl_validation_loss",
            "Validation loss after the latest epoch.",
            LABEL_NAMES,
            registry=registry,
        )
        self._validation_accuracy = Gauge(
            "globaldl_validation_accuracy_ratio",
            "Validation accuracy after the latest epoch (0 to 1).",
            LABEL_NAMES,
            registry=registry,
        )
        Gauge(
            "globaldl_run_info",
            "Always 1: the run this worker belongs to and the globaldl version it runs.",
            [*LABEL_NAMES, "version"],
            registry=registry,
        ).labels(*labels, __version__).set(1)
        Gauge(
            "globaldl_run_start_time_seconds",
            "Unix time at which this worker started exporting metrics.",
            LABEL_NAMES,
            registry=registry,
        ).labels(*labels).set_to_current_time()

    def observe_step(
        self,
        phase_seconds: Mapping[str, float],
        examples: int,
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        loss: float,
        skipped: bool = False,
    ) -> None:
        """Record one step. A skipped step still spent its time, examples and bytes.

        Raises ValueError naming an unknown phase, a negative duration or a negative count.
        """
        seconds = check_phase_seconds(phase_seconds)
        for phase, round_seconds in self._round_seconds.items():
            seconds[phase] += round_seconds
        self._round_seconds = dict.fromkeys(PHASES, 0.0)
        _check_count("examples", examples)
        _check_count("gradient_bytes_raw", gradient_bytes_raw)
        _check_count("gradient_bytes_wire", gradient_bytes_wire)
        for phase, phase_seconds_value in seconds.items():
            self._phase_seconds[phase].observe(phase_seconds_value)
        if self._first_step_seconds is not None:
            for phase, phase_seconds_value in seconds.items():
                self._first_step_seconds.labels(*self.label_values, phase).set(phase_seconds_value)
            self._first_step_seconds = None
        self._step_seconds.observe(sum(seconds.values()))
        self._steps.inc()
        if skipped:
            self._skipped_steps.inc()
        self._examples.inc(examples)
        self._gradient_bytes_raw.inc(gradient_bytes_raw)
        self._gradient_bytes_wire.inc(gradient_bytes_wire)
        if self._loss_child is None or self._last_step_time_child is None:
            self._loss_child = self._loss.labels(*self.label_values)
            self._last_step_time_child = self._last_step_time.labels(*self.label_values)
        self._loss_child.set(float(loss))
        self._last_step_time_child.set(time.time())

    def observe_round(
        self,
        phase_seconds: Mapping[str, float],
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        rounds: int = 1,
        skipped: bool = False,
    ) -> None:
        """Record a round's end: the loop's seconds in the sync phases and the round's bytes.

        The seconds are added to the next step's observation (that step waited for them), so
        the phase histograms keep one observation per step and their sums count the sync
        against the local compute; an epoch's end flushes what no step followed.
        """
        seconds = check_phase_seconds(phase_seconds)
        _check_count("rounds", rounds)
        _check_count("gradient_bytes_raw", gradient_bytes_raw)
        _check_count("gradient_bytes_wire", gradient_bytes_wire)
        for phase, phase_seconds_value in seconds.items():
            self._round_seconds[phase] += phase_seconds_value
        self._rounds.inc(rounds)
        if skipped:
            self._skipped_rounds.inc()
        self._gradient_bytes_raw.inc(gradient_bytes_raw)
        self._gradient_bytes_wire.inc(gradient_bytes_wire)

    def observe_epoch(self, epoch: int, val_loss: float, val_accuracy: float) -> None:
        """Record the validation that closed `epoch` (accuracy between 0 and 1)."""
        _check_count("epoch", epoch)
        if not math.isnan(val_accuracy) and not 0.0 <= val_accuracy <= 1.0:
            raise ValueError(f"val_accuracy is {val_accuracy!r}; expected a value from 0 to 1")
        if any(self._round_seconds.values()):
            for phase, round_seconds in self._round_seconds.items():
                self._phase_seconds[phase].observe(round_seconds)
            self._round_seconds = dict.fromkeys(PHASES, 0.0)
        self._epoch.set(epoch)
        self._validation_loss.labels(*self.label_values).set(float(val_loss))
        self._validation_accuracy.labels(*self.label_values).set(float(val_accuracy))
