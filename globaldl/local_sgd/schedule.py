"""How long a round of local steps lasts (`--sync-every`), and the settings rounds cannot take.

No TensorFlow here: the settings validate a run before TensorFlow loads.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

OUTER_OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "nesterov")
DEFAULT_OUTER_MOMENTUM = {"sgd": 0.0, "nesterov": 0.9}
# DiLoCo's outer learning rate for Nesterov (Douillard et al. 2023). `--outer-lr` defaults to 1
# for every optimizer, so a run asks for this one by name.
DILOCO_OUTER_LR = 0.7

_SECONDS = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*s\s*$")
_HELP = "use a whole number of steps >= 1 (e.g. 16) or a number of seconds > 0 with s (e.g. 2s)"


@dataclass(frozen=True)
class SyncInterval:
    """One round: a fixed number of local steps, or as many as fit in a wall-clock budget.

    Exactly one of `steps` and `seconds` is set. `steps == 1` is today's per-step exchange.

    >>> SyncInterval.parse("16"), SyncInterval.parse("2s")
    (SyncInterval(steps=16, seconds=None), SyncInterval(steps=None, seconds=2.0))
    """

    steps: int | None = 1
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.seconds is None):
            raise ValueError(f"sync_every {self!r} needs exactly one of steps and seconds")
        if self.steps is not None and (
            isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1
        ):
            raise ValueError(f"sync_every {self.steps!r} is not allowed; {_HELP}")
        if self.seconds is not None and not (
            isinstance(self.seconds, int | float)
            and math.isfinite(self.seconds)
            and self.seconds > 0
        ):
            raise ValueError(f"sync_every {self.seconds!r}s is not allowed; {_HELP}")

    @classmethod
    def parse(cls, value: Any) -> SyncInterval:
        """`16` or `"16"` -> 16 steps; `"2s"` or `"0.5s"` -> a 2 s or 0.5 s budget.

        Raises ValueError naming the value and what is allowed.
        """
        if isinstance(value, SyncInterval):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(steps=value)
        text = str(value).strip()
        if text.isdigit():
            return cls(steps=int(text))
        match = _SECONDS.match(text)
        if match is None:
            raise ValueError(f"sync_every {value!r} is not allowed; {_HELP}")
        return cls(steps=None, seconds=float(match.group(1)))

    @property
    def per_step(self) -> bool:
        """Whether this is today's training: one exchange of gradients after every step."""
        return self.steps == 1

    @property
    def by_time(self) -> bool:
        """Whether a round lasts a wall-clock budget (devices then take different step counts)."""
        return self.seconds is not None

    def __str__(self) -> str:
        if self.steps is not None:
            return str(self.steps)
        return f"{self.seconds:f}".rstrip("0").rstrip(".") + "s"  # no exponent: 0.00001s


def outer_momentum(optimizer: str, momentum: float | None) -> float:
    """The outer momentum to use: the given one, or the optimizer's default (Nesterov: 0.9)."""
    return DEFAULT_OUTER_MOMENTUM[optimizer] if momentum is None else momentum


def refusals(
    *,
    sync_every: SyncInterval,
    overlap: bool,
    outer_optimizer: str,
    outer_lr: float,
    outer_momentum: float | None,
    prune: str,
    weight_sparsity: float,
    elastic: bool,
) -> list[str]:
    """Why these settings cannot train in rounds, one sentence per reason (empty: they can)."""
    reasons = []
    if outer_optimizer not in OUTER_OPTIMIZER_NAMES:
        reasons.append(
            f"outer_optimizer {outer_optimizer!r} is not one of: {', '.join(OUTER_OPTIMIZER_NAMES)}"
        )
    if not (isinstance(outer_lr, int | float) and math.isfinite(outer_lr) and outer_lr > 0):
        reasons.append(f"outer_lr {outer_lr!r} is not allowed; use a positive number")
    if outer_momentum is not None and not (
        isinstance(outer_momentum, int | float) and 0.0 <= outer_momentum < 1.0
    ):
        reasons.append(f"outer_momentum {outer_momentum!r} is not allowed; use 0 <= momentum < 1")
    if sync_every.per_step:
        if overlap:
            reasons.append(
                "overlap needs sync_every > 1: with one step per round there is no local work "
                "to hide the exchange behind"
            )
        if (outer_optimizer, outer_lr, outer_momentum) != ("sgd", 1.0, None):
            reasons.append(
                "outer_optimizer, outer_lr and outer_momentum apply to rounds of local steps; "
                "with sync_every 1 every step exchanges gradients and there is no outer step"
            )
        return reasons
    if prune == "dgc":
        reasons.append(
            "prune 'dgc' cannot be combined with sync_every > 1: its momentum correction and "
            "local clipping act on each step's gradient, while a round sends a model delta that "
            "already holds the inner optimizer's momentum; use topk (the outer optimizer "
            "carries the momentum across rounds)"
        )
    if weight_sparsity > 0:
        reasons.append(
            "weight_sparsity cannot be combined with sync_every > 1: weight pruning recomputes "
            "its masks from the weights, which differ between devices inside a round"
        )
    if sync_every.by_time and elastic:
        reasons.append(
            "a wall-clock sync_every and elastic cannot be combined yet: epochs then end by the "
            "examples the whole fleet processed, which a membership change would recount"
        )
    return reasons
