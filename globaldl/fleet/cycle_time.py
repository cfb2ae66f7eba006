"""Choose HOROVOD_CYCLE_TIME per link: Horovod's coordination traffic against its latency.

Horovod's background thread negotiates which tensors are ready once per cycle, and it does so
even when nothing is ready: a few hundred bytes per device per cycle. Measured on this fleet
(2 devices, 0.25 cores each, idle ranks after hvd.init, bytes sent on eth0):

    HOROVOD_CYCLE_TIME   1 ms: 185 kB/s    10 ms: 40 kB/s    20 ms: 19 kB/s    50 ms: 8.3 kB/s

that is ~400 bytes per cycle (at 1 ms the throttled device manages a cycle every ~2 ms). At
Horovod's default of 1 ms that is 1.5 Mbit/s per device, twice a slow-4G uplink: there the
coordination alone saturates the link. A longer cycle costs latency instead, since a collective
waits for the cycle: measured with the ablation's quick runs (4 devices x 0.5 cores, 5 Mbit/s
up, LeNet, top-k 1% + int8, a loaded machine), the compressed step took 0.082 s at 1 ms and
0.160 s at 20 ms, about four cycles per step. So the rule below picks the SHORTEST cycle from a
ladder that keeps idle coordination under 20% of the narrower direction of the link: 1 ms
(Horovod's default) on fast links, 5 ms on LTE, 50 ms on slow 4G, 1 s on NB-IoT.
"""

from __future__ import annotations

import math

HOROVOD_DEFAULT_CYCLE_TIME_MS = 1.0
COORDINATION_BYTES_PER_CYCLE = 400
MAX_COORDINATION_SHARE = 0.20
CYCLE_TIME_LADDER_MS: tuple[float, ...] = (
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    50.0,
    100.0,
    200.0,
    500.0,
    1000.0,
)


def auto_cycle_time_ms(up_kbit_per_second: float, down_kbit_per_second: float) -> float:
    """The cycle time for a link: the shortest ladder value keeping coordination under 20%.

    >>> auto_cycle_time_ms(5000, 17500)   # lte: 3.2 ms needed
    5.0
    >>> auto_cycle_time_ms(750, 1600)     # slow-4g: 21 ms needed
    50.0
    """
    for name, value in (
        ("up_kbit_per_second", up_kbit_per_second),
        ("down_kbit_per_second", down_kbit_per_second),
    ):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    narrowest_bytes_per_second = min(up_kbit_per_second, down_kbit_per_second) * 1000 / 8
    needed_ms = (
        1000 * COORDINATION_BYTES_PER_CYCLE / (MAX_COORDINATION_SHARE * narrowest_bytes_per_second)
    )
    for cycle_ms in CYCLE_TIME_LADDER_MS:
        if cycle_ms >= needed_ms:
            return cycle_ms
    return CYCLE_TIME_LADDER_MS[-1]


def coordination_bytes_per_second(cycle_time_ms: float) -> float:
    """Idle coordination traffic per device at `cycle_time_ms` (the measured rule of thumb)."""
    if not cycle_time_ms > 0:
        raise ValueError(f"cycle_time_ms must be > 0, got {cycle_time_ms!r}")
    return COORDINATION_BYTES_PER_CYCLE * 1000 / cycle_time_ms
