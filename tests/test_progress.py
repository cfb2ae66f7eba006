"""Rank 0's progress line within an epoch: when it prints and what it says."""

from __future__ import annotations

import pytest

from globaldl.progress import EpochProgress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_prints_steps_rate_and_eta_once_per_interval() -> None:
    clock, lines = FakeClock(), []
    progress = EpochProgress(0, 3, 100, 64, interval_seconds=30, clock=clock, emit=lines.append)
    for step in range(1, 21):  # 20 steps in 40 s: 0.5 steps/s
        clock.now += 2.0
        progress.step_done(step)
    assert lines == [
        "epoch 1/3  step 15/100  32 examples/s  ETA 2m50s",
    ]


def test_silent_before_the_interval_and_at_the_epochs_last_step() -> None:
    clock, lines = FakeClock(), []
    progress = EpochProgress(0, 1, 10, 16, interval_seconds=30, clock=clock, emit=lines.append)
    clock.now += 29
    progress.step_done(5)
    clock.now += 60
    progress.step_done(10)  # the end-of-epoch line says it all
    assert lines == []


def test_rate_after_an_elastic_restart_counts_only_the_steps_run_since() -> None:
    clock, lines = FakeClock(), []
    progress = EpochProgress(
        1, 2, 100, 10, first_step=50, interval_seconds=10, clock=clock, emit=lines.append
    )
    clock.now += 10
    progress.step_done(60)
    assert lines == ["epoch 2/2  step 60/100  10 examples/s  ETA 40s"]


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        EpochProgress(0, 1, 1, 1, interval_seconds=0)
