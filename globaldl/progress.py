"""Rank 0's progress line within an epoch: steps done, examples per second, time left."""

from __future__ import annotations

import time
from collections.abc import Callable

# Often enough to show a slow-link epoch is alive, rarely enough to stay out of the way; an
# epoch shorter than this prints only its end-of-epoch line.
PROGRESS_INTERVAL_SECONDS = 30.0


def _print_line(line: str) -> None:
    print(line, flush=True)


class EpochProgress:
    """Prints `epoch E/N  step S/T  X examples/s  ETA Ms` at most every `interval_seconds`.

    The rate counts steps since the epoch (or an elastic restart within it) began, times the
    global batch: every rank steps together, so rank 0's rate is the fleet's.
    """

    def __init__(
        self,
        epoch: int,
        epochs: int,
        steps_per_epoch: int,
        global_batch_size: int,
        first_step: int = 0,
        *,
        interval_seconds: float = PROGRESS_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[str], None] = _print_line,
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds {interval_seconds!r} must be > 0")
        self.epoch, self.epochs = epoch, epochs
        self.steps_per_epoch, self.global_batch_size = steps_per_epoch, global_batch_size
        self.first_step = first_step
        self.interval_seconds = interval_seconds
        self.clock, self.emit = clock, emit
        self.started = self.last_printed = clock()

    def step_done(self, steps_done: int) -> None:
        """Call after each step with the steps done in this epoch; prints when it is time."""
        now = self.clock()
        if now - self.last_printed < self.interval_seconds or steps_done >= self.steps_per_epoch:
            return
        self.last_printed = now
        elapsed = now - self.started
        steps = steps_done - self.first_step
        steps_per_second = steps / elapsed if elapsed > 0 else 0.0
        left_seconds = (self.steps_per_epoch - steps_done) / steps_per_second if steps else 0.0
        self.emit(
            f"epoch {self.epoch + 1}/{self.epochs}  step {steps_done}/{self.steps_per_epoch}  "
            f"{steps_per_second * self.global_batch_size:.0f} examples/s  "
            f"ETA {_duration(left_seconds)}"
        )


class NoProgress(EpochProgress):
    """What ranks other than 0 get: nothing printed."""

    def __init__(self) -> None:
        super().__init__(0, 1, 1, 1, emit=lambda line: None)

    def step_done(self, steps_done: int) -> None:
        """Print nothing."""


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
