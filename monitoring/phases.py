"""The phases of one training step, and the bottleneck rule shared by the report and PromQL."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import TypeVar

PHASES: tuple[str, ...] = ("data_load", "compute", "compress", "exchange", "decompress", "apply")
"""The phases of one training step, in the order data flows through them."""

RankKey = TypeVar("RankKey", bound=Hashable)


def check_phase_seconds(phase_seconds: Mapping[str, float]) -> dict[str, float]:
    """Return all six phases' seconds (a phase that did not run counts 0.0).

    Raises ValueError naming an unknown phase or a negative or non-finite duration.
    """
    checked = dict.fromkeys(PHASES, 0.0)
    for phase, seconds in phase_seconds.items():
        if phase not in checked:
            raise ValueError(f"unknown phase {phase!r}; allowed phases: {', '.join(PHASES)}")
        seconds = float(seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"phase {phase!r} took {seconds!r} seconds; expected a finite value >= 0"
            )
        checked[phase] = seconds
    return checked


def phase_shares(phase_seconds: Mapping[str, float]) -> dict[str, float]:
    """Each phase's share of the step time (the shares sum to 1).

    Raises ValueError when no time was spent at all: a share of nothing is undefined.
    """
    seconds = check_phase_seconds(phase_seconds)
    step_seconds = sum(seconds.values())
    if step_seconds <= 0:
        raise ValueError("phase seconds sum to 0; a bottleneck needs some measured step time")
    return {phase: value / step_seconds for phase, value in seconds.items()}


def own_seconds_per_step(
    seconds_per_step_by_rank: Mapping[RankKey, Mapping[str, float]],
) -> dict[RankKey, dict[str, float]]:
    """Each rank's own seconds per step: the exchange cut down to its transfer time.

    In synchronous training a rank that reaches the exchange early waits there for the slowest
    rank, so one rank's slow input shows up as exchange time on every other rank. The rank that
    arrives last waits for nobody: the least exchange time per step of any rank of the run is
    the transfer itself. Every rank's exchange is counted as that transfer; what it measured
    beyond it was waiting for peers, which the straggler views attribute to the slow rank.
    Mirrored by the recording rule `globaldl:own_phase_seconds_per_step:mean1m`.

    The least mean is the transfer while one rank stays last. When every rank's input is equally
    slow, which rank runs behind changes during a run (each pipeline's prefetch buffer runs
    ahead in turn), so every rank spends part of its steps waiting and the least mean still
    holds some of that. The verdict then may split between data_load and exchange. The least
    exchange of every step would not, but it needs every rank's times of each step in one place,
    which neither the exporters nor the summary carry.

    `seconds_per_step_by_rank` maps any rank key to its mean seconds per step in each phase
    (all ranks of one run).
    """
    checked = {
        rank: check_phase_seconds(seconds) for rank, seconds in seconds_per_step_by_rank.items()
    }
    if not checked:
        return {}
    transfer_seconds = min(seconds["exchange"] for seconds in checked.values())
    return {rank: {**seconds, "exchange": transfer_seconds} for rank, seconds in checked.items()}


def bottleneck_phase(phase_seconds: Mapping[str, float]) -> str:
    """The bottleneck: the phase with the largest share of step time.

    This is the one rule of globaldl for naming a bottleneck. The report applies it to a
    device's own seconds per step (own_seconds_per_step, averaged over the device's ranks); the
    recording rules in deploy/prometheus/rules/globaldl.rules.yml mirror both steps in PromQL
    (`globaldl:bottleneck_share:ratio` is
    `topk by (run, device) (1, globaldl:own_phase_share:ratio)`).
    A tie goes to the phase that comes first in the step, so the answer is deterministic.

    >>> bottleneck_phase({"data_load": 0.3, "compute": 0.1, "exchange": 0.2})
    'data_load'
    """
    shares = phase_shares(phase_seconds)
    return max(PHASES, key=lambda phase: (shares[phase], -PHASES.index(phase)))
