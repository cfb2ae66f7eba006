"""Two Gloo timeouts for elastic runs: a long one while a ring forms, a short one once it trains.

Horovod 0.28.1 has one knob for how long Gloo waits, HOROVOD_GLOO_TIMEOUT_SECONDS, and it bounds
two different waits:

* the rendezvous of a new ring (every worker waits for every other worker to reach
  `hvd.init`, including a joining device that is still starting Python and TensorFlow: ~20 s
  at 0.5 core), and
* every collective of a formed ring (a survivor waits that long for a peer that vanished
  without closing its connections: a dead device sends no FIN or RST, so nothing but the
  timeout ends the wait).

A long value keeps slow joiners in; a short one detects deaths early. One value cannot do both.
What Horovod does allow: the C++ core reads the variable from the process environment at every
`hvd.init`, and an elastic worker calls `hvd.shutdown(); hvd.init()` at every membership
change. So each worker sets the LONG join timeout before every `hvd.init` that may wait for a
joiner (the first one, and every re-formation after a failure or a host change), and, once the
new ring has run a few steps with every member, re-forms once more with the SHORT collective
timeout. That second re-formation is cheap (every member is warm: no joiner, the same size and
ranks, the trainer and its traced step are kept) and all workers take it at the same committed
step, decided by rank 0 and broadcast.

The short timeout is only used when it is safe: a healthy collective can legitimately wait as
long as the slowest peer's step (compute plus exchange on its link), so the collective timeout
is at least `STEP_SAFETY_FACTOR` x the slowest step seen on the new ring; when that reaches the
join timeout the ring stays on the join timeout (nothing to gain).

Other Horovod mechanisms, and why they are not the answer here:

* The host-discovery script dropping a device (`fleet kill`, or its sshd gone) makes the
  launcher end that device's worker command at once and record it as failed, so the re-formed
  ring does not wait for it; but the driver only notifies rank 0's notification service, which
  is read at the next commit: a worker blocked inside a Gloo collective is not interrupted.
  The fleet's discovery already drops a device as soon as it is killed or its sshd is gone.
* `--elastic-timeout` (HOROVOD_ELASTIC_TIMEOUT) bounds the launcher's wait for enough hosts;
  `--start-timeout` the launcher's wait for workers to start. Neither shortens a collective.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

HOROVOD_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
JOIN_TIMEOUT_ENV = "GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS"
COLLECTIVE_TIMEOUT_ENV = "GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS"
# Long enough for a 0.5-core device to start Python and TensorFlow (~20 s) with room to spare.
DEFAULT_JOIN_TIMEOUT_SECONDS = 60
# Short enough that detection (10 s) plus the re-formation leaves the next step within 30 s.
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 10
# A collective may wait one slowest step for a peer; 4x leaves room for a slow stretch.
STEP_SAFETY_FACTOR = 4.0
# Timed steps on a new ring before the collective timeout is chosen (its first step traces).
STEPS_BEFORE_TIGHTENING = 3


def _positive_seconds(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name)
    if text is None or text == "":
        return default
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise ValueError(f"{name} must be a whole number of seconds >= 1, got {text!r}")
    return seconds


@dataclass(frozen=True)
class GlooTimeouts:
    """The join timeout (ring formation) and the collective timeout (a formed ring), seconds."""

    join_seconds: int = DEFAULT_JOIN_TIMEOUT_SECONDS
    collective_seconds: int = DEFAULT_COLLECTIVE_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if self.join_seconds < 1 or self.collective_seconds < 1:
            raise ValueError(
                f"Gloo timeouts must be >= 1 s, got join {self.join_seconds} s and collective "
                f"{self.collective_seconds} s"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GlooTimeouts:
        """Read both timeouts; a bare HOROVOD_GLOO_TIMEOUT_SECONDS is taken as the join timeout.

        Raises ValueError naming the variable when a value is not a whole number >= 1.
        """
        environ = os.environ if environ is None else environ
        join_default = _positive_seconds(environ, HOROVOD_TIMEOUT_ENV, DEFAULT_JOIN_TIMEOUT_SECONDS)
        return cls(
            join_seconds=_positive_seconds(environ, JOIN_TIMEOUT_ENV, join_default),
            collective_seconds=_positive_seconds(
                environ, COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
            ),
        )

    def safe_collective_seconds(self, slowest_step_seconds: float) -> int | None:
        """The collective timeout for a ring whose slowest step took this long; None: keep join.

        At least the configured collective timeout and `STEP_SAFETY_FACTOR` x the slowest step;
        None when that is not shorter than the join timeout.
        """
        if not slowest_step_seconds >= 0:
            raise ValueError(f"slowest step must be >= 0 s, got {slowest_step_seconds!r}")
        needed = math.ceil(STEP_SAFETY_FACTOR * slowest_step_seconds)
        seconds = max(self.collective_seconds, needed)
        return seconds if seconds < self.join_seconds else None


def use_gloo_timeout(seconds: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Make the next `hvd.init` of this process use `seconds` as its Gloo timeout."""
    environ = os.environ if environ is None else environ
    environ[HOROVOD_TIMEOUT_ENV] = str(int(seconds))
