"""HOROVOD_CYCLE_TIME per link: moved to globaldl.fleet.cycle_time (`fleet run` uses it too).

Kept so that experiments and their tests keep importing it from here.
"""

from globaldl.fleet.cycle_time import (
    COORDINATION_BYTES_PER_CYCLE,
    CYCLE_TIME_LADDER_MS,
    HOROVOD_DEFAULT_CYCLE_TIME_MS,
    MAX_COORDINATION_SHARE,
    auto_cycle_time_ms,
    coordination_bytes_per_second,
    measured_coordination_text,
)

__all__ = [
    "COORDINATION_BYTES_PER_CYCLE",
    "CYCLE_TIME_LADDER_MS",
    "HOROVOD_DEFAULT_CYCLE_TIME_MS",
    "MAX_COORDINATION_SHARE",
    "auto_cycle_time_ms",
    "coordination_bytes_per_second",
    "measured_coordination_text",
]
