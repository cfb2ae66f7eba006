"""The ledger that keeps overlapped rounds in order, and the background exchange thread."""

from __future__ import annotations

import threading

import pytest

from globaldl.local_sgd.overlap import RoundLedger, RoundOrderError, run_in_background


def test_rounds_apply_once_each_in_submission_order() -> None:
    ledger = RoundLedger()
    first, second = ledger.submit(), ledger.submit()
    assert ledger.in_flight == 2
    ledger.apply(first)
    with pytest.raises(RoundOrderError, match="round 0 applied, but the next round to apply is 1"):
        ledger.apply(first)  # twice
    third = ledger.submit()
    with pytest.raises(RoundOrderError, match="round 2 applied"):
        ledger.apply(third)  # skips round 1
    ledger.apply(second)
    ledger.apply(third)
    assert ledger.applied == [0, 1, 2] and ledger.in_flight == 0
    with pytest.raises(RoundOrderError, match="3 submitted"):
        ledger.apply(3)  # never submitted


def test_a_restarted_ledger_continues_after_the_rounds_done() -> None:
    ledger = RoundLedger()
    ledger.restart_at(5)
    assert ledger.submit() == 5 and ledger.apply(5) == 5


def test_background_calls_run_one_at_a_time_in_submission_order() -> None:
    order: list[int] = []
    running = threading.Lock()

    def job(index: int) -> int:
        assert running.acquire(blocking=False), "two exchanges ran at once"
        order.append(index)
        running.release()
        return index * index

    futures = [run_in_background(job, index) for index in range(20)]
    assert [future.result(timeout=30) for future in futures] == [i * i for i in range(20)]
    assert order == list(range(20))
    failed = run_in_background(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(timeout=30)
    assert run_in_background(job, 3).result(timeout=30) == 9  # a failure does not stop it
