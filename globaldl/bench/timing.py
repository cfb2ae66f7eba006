"""What phase timing costs: the same training step with and without its six timestamps."""

from __future__ import annotations

import statistics
import time
from typing import Any

from globaldl.settings import TrainSettings


def _seconds_per_step(trainer: Any, steps: int) -> float:
    iterator = iter(trainer.pipeline.train_batches(0).repeat())
    trainer._train_step(iterator).numpy()  # trace and warm up
    started = time.perf_counter()
    for _ in range(steps):
        trainer._train_step(iterator).numpy()
    return (time.perf_counter() - started) / steps


def measure_timing_cost(settings: TrainSettings, steps: int, repeats: int) -> dict[str, Any]:
    """Median seconds per step with and without phase timing, alternating to cancel drift."""
    from globaldl.exchange import Exchange
    from globaldl.trainer import Trainer

    exchange = Exchange()
    timed = Trainer(settings, exchange, phase_timing=True)
    untimed = Trainer(settings, exchange, phase_timing=False)
    with_timing, without_timing = [], []
    for _ in range(repeats):
        with_timing.append(_seconds_per_step(timed, steps))
        without_timing.append(_seconds_per_step(untimed, steps))
    timed_seconds = statistics.median(with_timing)
    untimed_seconds = statistics.median(without_timing)
    return {
        "model": settings.model,
        "dataset": settings.dataset,
        "batch_size": settings.batch_size,
        "steps": steps,
        "repeats": repeats,
        "step_ms_with_timing": 1000 * timed_seconds,
        "step_ms_without_timing": 1000 * untimed_seconds,
        "timing_cost_ms": 1000 * (timed_seconds - untimed_seconds),
        "timing_cost_percent": 100 * (timed_seconds - untimed_seconds) / untimed_seconds,
    }
