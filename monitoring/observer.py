"""What the trainer calls to report a step or an epoch, and the observer for metrics off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable


@runtime_checkable
class TrainingObserver(Protocol):
    """Receives what the trainer measured; implementations must never make a step wait.

    The trainer calls `observe_step` once per step on every rank, `observe_round` at the end
    of every round of local steps (`--sync-every` > 1), `observe_epoch` after each
    validation, and `close` once at the end. It never formats metrics itself.
    """

    def observe_step(
        self,
        phase_seconds: Mapping[str, float],
        examples: int,
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        loss: float,
        skipped: bool = False,
    ) -> None:
        """Record one training step: seconds per phase, examples, gradient bytes, loss."""
        ...

    def observe_round(
        self,
        phase_seconds: Mapping[str, float],
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        rounds: int = 1,
        skipped: bool = False,
    ) -> None:
        """Record a round's end: the loop's sync seconds, bytes, rounds completed, skipped.

        `rounds` is the number of exchanges that completed there (0 or 1).
        """
        ...

    def observe_epoch(self, epoch: int, val_loss: float, val_accuracy: float) -> None:
        """Record the result of the validation that closes `epoch`."""
        ...

    def close(self) -> None:
        """Flush what was observed (an exporter waits for one last scrape) and stop."""
        ...


class NullObserver:
    """The observer used when metrics are disabled: it records nothing and costs nothing."""

    def observe_step(
        self,
        phase_seconds: Mapping[str, float],
        examples: int,
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        loss: float,
        skipped: bool = False,
    ) -> None:
        """Ignore the step."""

    def observe_round(
        self,
        phase_seconds: Mapping[str, float],
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        rounds: int = 1,
        skipped: bool = False,
    ) -> None:
        """Ignore the round."""

    def observe_epoch(self, epoch: int, val_loss: float, val_accuracy: float) -> None:
        """Ignore the epoch."""

    def close(self) -> None:
        """Nothing to stop."""
