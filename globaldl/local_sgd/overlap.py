"""Round exchanges in the background, one at a time, and the ledger that keeps them in order.

Horovod matches collectives across ranks by name, and a name may be outstanding only once: a
round's exchange must be submitted on every rank in the same order, and the next one only
after the previous one finished. One background thread per process runs the submitted
exchanges strictly in submission order; the training loop submits round t at its end and waits
for it at the end of round t+1, so at most one exchange is ever in flight and it always carries
the same name. The thread is shared by every trainer the process builds (an elastic worker
builds a new one after each membership change) and is a daemon: a collective stuck on a dead
peer cannot keep the process from exiting.

`RoundLedger` is the proof that no round is applied twice or skipped: every round gets an
index when submitted, and applying any index but the next one raises.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


class RoundOrderError(RuntimeError):
    """A round was applied out of order, twice, or never submitted."""


@dataclass
class RoundLedger:
    """Round indices: submitted in order, applied in the same order, each exactly once.

    >>> ledger = RoundLedger()
    >>> ledger.submit(), ledger.submit(), ledger.apply(0), ledger.apply(1)
    (0, 1, 0, 1)
    """

    submitted: int = 0
    applied: list[int] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        """Rounds submitted and not yet applied."""
        return self.submitted - len(self.applied)

    def submit(self) -> int:
        """The index of the round now being submitted."""
        self.submitted += 1
        return self.submitted - 1

    def apply(self, index: int) -> int:
        """Record that round `index` is applied; raise RoundOrderError unless it is the next."""
        expected = len(self.applied)
        if index != expected or index >= self.submitted:
            raise RoundOrderError(
                f"round {index} applied, but the next round to apply is {expected} "
                f"({self.submitted} submitted): a round would be applied twice or skipped"
            )
        self.applied.append(index)
        return index

    def restart_at(self, rounds_done: int) -> None:
        """Continue after `rounds_done` rounds (a resumed run, or a rollback to a commit)."""
        self.submitted = rounds_done
        self.applied = list(range(rounds_done))


@dataclass
class PendingRound:
    """A round whose exchange runs in the background."""

    index: int
    future: Future[Any]


class _BackgroundThread:
    """One daemon thread running submitted calls in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="round-exchange", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((future, call, args))
        return future

    def _run(self) -> None:
        while True:
            future, call, args = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call(*args))
            except BaseException as error:  # handed to the waiting training loop
                future.set_exception(error)


_background: _BackgroundThread | None = None
_background_lock = threading.Lock()


def run_in_background(call: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run `call(*args)` on the process's round-exchange thread, after everything before it."""
    global _background
    with _background_lock:
        if _background is None:
            _background = _BackgroundThread()
        return _background.submit(call, *args)
