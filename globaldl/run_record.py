"""What a run adds up as it trains (its totals, each epoch's result), and the summary made of them.

The summary is rank 0's view of the run, with what only collectives can add: every rank's
device name, weight digest and own phase totals (`run_summary`, called once at the end).
"""

from __future__ import annotations

import hashlib
import platform
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

import globaldl
from globaldl import horovod_edits, summary
from globaldl.exchange import (
    collectives_per_step,
    dense_device_tx_bytes_per_step_model,
    device_tx_bytes_per_step_model,
)
from globaldl.local_sgd.report import rounds_summary
from globaldl.monitoring import PHASES

if TYPE_CHECKING:
    from globaldl.trainer import Trainer


@dataclass
class EpochResult:
    """One epoch's numbers, averaged over all ranks."""

    epoch: int
    loss: float
    accuracy: float
    val_loss: float
    val_accuracy: float
    seconds: float
    examples_per_second: float

    def as_dict(self) -> dict[str, float | int]:
        """The epoch as a plain dict (the summary's history entry)."""
        return dict(self.__dict__)


@dataclass
class RunTotals:
    """What rank 0 adds up over the run for the summary."""

    steps: int = 0
    skipped_steps: int = 0
    gradient_bytes_raw: int = 0
    gradient_bytes_wire: int = 0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    # Process CPU time (every thread: TensorFlow, Horovod's loop) when the totals started.
    cpu_started_seconds: float = field(default_factory=time.process_time)
    # Process CPU time inside training steps, and over how many: every step but the first
    # of the totals (which traces the graph) counts.
    step_cpu_seconds: float = 0.0
    step_cpu_steps: int = 0
    # The phases of that first step: it also waits for the slowest rank to trace and for
    # Horovod's first negotiation, which a short run's mean step would otherwise carry.
    first_step_phase_seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(PHASES, 0.0)
    )
    # The loop's own wall time a step: from one step's start to the next one's, so that
    # what no phase times (dispatch, the loop's bookkeeping, a round's end) is in it. Within
    # epochs only (validation and the next epoch's input pipeline are not steps), and not
    # an epoch's first step: the run's traces the graph, a later epoch's waits for the
    # slowest rank to come out of the epoch's end (tens of seconds on a 16-device fleet at
    # 0.125 core, where a step takes 6 s).
    step_wall_seconds: float = 0.0
    step_wall_steps: int = 0
    last_step_started: float | None = None
    epoch_steps_started: int = 0


def _weight_digests(trainer: Trainer) -> list[str]:
    """SHA-256 of this rank's final weights, gathered from every rank in rank order."""
    digest = hashlib.sha256()
    for variable in trainer.model.variables:
        digest.update(variable.numpy().tobytes())
    return trainer.exchange.gather_text(digest.hexdigest(), "weight_digests")


def _rank_totals(trainer: Trainer, totals: RunTotals) -> list[dict[str, Any]]:
    """Every rank's own phase totals and process CPU seconds, gathered in rank order.

    Rank 0's phases alone cannot show unequal ranks (CPU shares, local batches); the CPU
    seconds show what a CPU quota really had to grant: over the run (`cpu_seconds`, with
    start-up, validation and checkpoints) and inside the training steps alone
    (`step_cpu_seconds` over `step_cpu_steps`, the traced first step left out). The first
    step's own phases (`first_step_phase_seconds`) let a reader take the steady step.
    """
    own = [totals.phase_seconds[name] for name in PHASES]
    own.append(time.process_time() - totals.cpu_started_seconds)
    own += [totals.step_cpu_seconds, float(totals.step_cpu_steps)]
    own += [totals.first_step_phase_seconds[name] for name in PHASES]
    rows = trainer.exchange.gather_across_ranks(tf.constant([own], tf.float64), "rank_totals")
    cpu = len(PHASES)
    first = cpu + 3
    return [
        {
            "phase_seconds": dict(zip(PHASES, row[:cpu].tolist(), strict=True)),
            "cpu_seconds": float(row[cpu]),
            "step_cpu_seconds": float(row[cpu + 1]),
            "step_cpu_steps": int(row[cpu + 2]),
            "first_step_phase_seconds": dict(
                zip(PHASES, row[first : first + cpu].tolist(), strict=True)
            ),
        }
        for row in rows.numpy()
    ]


def _rank_round_times(trainer: Trainer) -> list[list[list[float | None]]]:
    """Every rank's [handed, back] clock times per round (`RoundTotals`), in rank order."""
    assert trainer.rounds is not None
    clock = trainer.rounds.totals.round_clock_unix
    own = np.array(clock, dtype=np.float64).reshape(-1, 2)  # a result never back: NaN
    counts = trainer.exchange.gather_across_ranks(
        tf.constant([len(own)], tf.int64), "round_time_counts"
    ).numpy()
    rows = trainer.exchange.gather_across_ranks(tf.constant(own), "round_times").numpy()
    ranks = np.split(rows, np.cumsum(counts)[:-1])
    return [
        [[float(value) if np.isfinite(value) else None for value in row] for row in rank]
        for rank in ranks
    ]


def _exchange_fields(trainer: Trainer) -> dict[str, Any]:
    """Which collective ran, read from the compressor's wire declaration (`wire`).

    In rounds (`--sync-every` > 1) `collectives_per_step` counts one exchange's payload
    collectives, which run once per round, not once per local step;
    `collectives_per_round` adds the small allreduce of sample counts when it travels.
    """
    payload_collectives = collectives_per_step(trainer.wire_spec, trainer.exchange.hierarchy)
    fields: dict[str, Any] = {
        "combine": trainer.wire_spec.combine.value,
        "collectives_per_step": payload_collectives,
        "hierarchy": trainer.settings.hierarchy,
        "wire": trainer.wire_spec.describe(),
        "horovod_started_unix_seconds": trainer.exchange.started_unix_seconds,
    }
    if trainer.rounds is not None:
        counts = 1 if trainer.rounds.graph.counts_travel else 0
        fields["collectives_per_round"] = payload_collectives + counts
    return fields


def _traffic_fields(trainer: Trainer, totals: RunTotals) -> dict[str, Any]:
    """Per-device bytes per step by the collectives' algorithms, against dense fp32.

    In rounds a step's bytes are the rounds' bytes spread over the local steps.
    """
    payload_bytes = totals.gradient_bytes_wire / max(totals.steps, 1)
    modelled = device_tx_bytes_per_step_model(
        trainer.wire_spec, trainer.size, payload_bytes, trainer.exchange.hierarchy
    )
    dense = dense_device_tx_bytes_per_step_model(
        trainer.compressor.raw_bytes_per_step, trainer.size
    )
    return summary.traffic(
        device_tx_bytes_per_step_model=modelled,
        dense_device_tx_bytes_per_step_model=dense,
        payload_bytes_per_step=payload_bytes,
        collectives_outside_steps=[call.to_dict() for call in trainer.exchange.ledger.calls()],
    )


def run_summary(
    trainer: Trainer,
    last: EpochResult,
    totals: RunTotals,
    history: list[dict[str, Any]],
    wall_seconds: float,
    first_epoch: int,
) -> dict[str, Any]:
    """The run summary, with every rank's device name and weight digest (collectives).

    Every rank calls it (it gathers from all), once training is over: the ranks' moving
    statistics are averaged first, so every rank's weight digest covers the same model.
    """
    import horovod

    trainer.synchronise_local_statistics()
    digests = _weight_digests(trainer)
    devices = trainer.exchange.gather_text(trainer.device, "devices")
    rank_totals = _rank_totals(trainer, totals)
    settings = trainer.settings
    return {
        "schema_version": summary.SCHEMA_VERSION,
        "run_id": settings.run_id or "run",
        "model": settings.model,
        "model_options": {
            "depth": settings.depth,
            "layers": settings.layers,
            "width": settings.width,
            "batch_norm": settings.batch_norm,
        },
        "dataset": settings.dataset,
        "ranks": trainer.size,
        "epochs": settings.epochs,
        "steps": totals.steps,
        "skipped_steps": totals.skipped_steps,
        "global_batch_size": trainer.global_batch_size,
        "balance": settings.balance,
        "rank_batch_sizes": list(trainer.rank_batch_sizes),
        "measured_speeds": trainer.measured_speeds,
        "learning_rate": trainer.learning_rate,
        "learning_rate_schedule": {
            "warmup_epochs": settings.lr_warmup_epochs,
            "decay": settings.lr_decay,
        },
        "val_accuracy": last.val_accuracy,
        "val_loss": last.val_loss if np.isfinite(last.val_loss) else 0.0,
        "history": history,
        "wall_seconds": wall_seconds,
        "phase_seconds": totals.phase_seconds,
        "step_wall_seconds": totals.step_wall_seconds,
        "step_wall_steps": totals.step_wall_steps,
        "rank_totals": rank_totals,
        "gradient_bytes_raw": totals.gradient_bytes_raw,
        "gradient_bytes_wire": totals.gradient_bytes_wire,
        "compression_ratio": summary.compression_ratio(
            totals.gradient_bytes_raw, totals.gradient_bytes_wire
        ),
        "compression": settings.compression.get_config(),
        "exchange": _exchange_fields(trainer),
        "traffic": _traffic_fields(trainer, totals),
        "rounds": rounds_summary(
            sync_every=settings.sync_interval,
            phase_seconds=totals.phase_seconds,
            steps=totals.steps,
            skipped_steps=totals.skipped_steps,
            examples=totals.steps * trainer.batch_size,
            gradient_bytes_wire=totals.gradient_bytes_wire,
            raw_bytes_per_step=trainer.compressor.raw_bytes_per_step,
            batch_size=trainer.batch_size,
            engine_fields=(
                trainer.rounds.summary() | {"rank_round_unix_seconds": _rank_round_times(trainer)}
                if trainer.rounds
                else None
            ),
        ),
        "resumed_from_epoch": first_epoch if settings.resume else None,
        "devices": devices,
        "weight_digests": digests,
        "weights_identical": len(set(digests)) == 1,
        "versions": {
            "tensorflow": tf.__version__,
            "horovod": horovod.__version__,
            "globaldl": globaldl.__version__,
            "python": platform.python_version(),
            # Which of the build's source edits this Horovod has (gathers changed with the
            # receive-first edit); [] for a Horovod globaldl did not build.
            "horovod_edits": list(horovod_edits.installed()),
        },
    }
