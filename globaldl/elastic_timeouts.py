"""Two Gloo timeouts for elastic runs: a long one while a ring forms, a short one once it trains.

Horovod 0.28.1 has one knob for how long Gloo waits, HOROVOD_GLOO_TIMEOUT_SECONDS, and it bounds
two different waits:

* the rendezvous of a new ring (every worker waits for every other worker to reach
  `hvd.init`, including a joining device that is still starting Python and TensorFlow: ~20 s
  at 0.5 core), and
* every collective of a formed ring (a survivor waits that long for a peer that vanished
  without closing its connections: a dead device sends no FIN or RST, so nothing but the
  timeout ends the wait).

A long value keeps slow joiners in; a short one detects deaths early. One value cannot do both,
so globaldl's Horovod build (scripts/build-horovod.sh, third edit) splits them: the rendezvous
waits for its peers under GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS, then the formed ring takes
HOROVOD_GLOO_TIMEOUT_SECONDS for every collective. Both are read at every `hvd.init`, and an
elastic worker calls `hvd.shutdown(); hvd.init()` at every membership change, so each worker
sets both before every `hvd.init` (`use_gloo_timeouts`): every ring forms under the join
timeout and trains under the collective timeout from its first step.

The short timeout must still outlast a healthy collective, which can take as long as the
slowest peer's transfer on its link. The collective timeout is at least `STEP_SAFETY_FACTOR` x
the slowest step seen on a ring: when a ring's first timed steps are slower than that allows,
every worker re-forms it once under the longer timeout (a loosening, decided by rank 0 and
broadcast, at the same committed step).

A Horovod without the edit (an older wheel) waits for a rendezvous under the collective
timeout, where a short one would abort the run whenever a device joins slowly: then both waits
use the join timeout, and a vanished device is noticed only after it.

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

from globaldl import horovod_edits

HOROVOD_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
JOIN_TIMEOUT_ENV = "GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS"
COLLECTIVE_TIMEOUT_ENV = "GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS"
# Long enough for a 0.5-core device to start Python and TensorFlow (~20 s) with room to spare.
DEFAULT_JOIN_TIMEOUT_SECONDS = 60
# Short enough that detection (10 s) plus the re-formation leaves the next step within 30 s.
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 10
# A collective may wait one slowest step for a peer; 4x leaves room for a slow stretch.
STEP_SAFETY_FACTOR = 4.0
# Timed steps on a new ring before its collective timeout is checked (its first step traces).
STEPS_BEFORE_TIMEOUT_CHECK = 3


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

    def safe_collective_seconds(self, slowest_step_seconds: float) -> int:
        """The collective timeout for a ring whose slowest step took this long.

        The configured collective timeout, or `STEP_SAFETY_FACTOR` x the slowest step if longer.
        """
        if not slowest_step_seconds >= 0:
            raise ValueError(f"slowest step must be >= 0 s, got {slowest_step_seconds!r}")
        return max(self.collective_seconds, math.ceil(STEP_SAFETY_FACTOR * slowest_step_seconds))


def horovod_splits_the_timeouts() -> bool:
    """Whether this Horovod was built with the rendezvous join-timeout edit."""
    return horovod_edits.JOIN_TIMEOUT in horovod_edits.installed()


def use_gloo_timeouts(
    collective_seconds: int, join_seconds: int, environ: MutableMapping[str, str] | None = None
) -> None:
    """Set what this process's next `hvd.init` reads: the rendezvous's and collectives' waits."""
    environ = os.environ if environ is None else environ
    environ[HOROVOD_TIMEOUT_ENV] = str(int(collective_seconds))
    environ[JOIN_TIMEOUT_ENV] = str(int(join_seconds))
