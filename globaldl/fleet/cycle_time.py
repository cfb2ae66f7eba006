"""Choose HOROVOD_CYCLE_TIME per link: Horovod's coordination traffic against its latency.

Horovod's background thread negotiates which tensors are ready once per cycle, and it does so
even when nothing is ready: a few small messages per device per cycle, mostly headers on the
wire. `globaldl bench coordination` measures it per device count and cycle time on the fleet
(results/bench/coordination.md; the byte accounting uses the same measurement), and checks the
rule's constant below against the busiest rank's bytes per cycle. At Horovod's default of 1 ms
that traffic can exceed a slow-4G uplink by itself. A longer cycle costs latency instead, since
a collective waits for the cycle: measured with the ablation's quick runs (4 devices x 0.5
cores, 5 Mbit/s up, LeNet, top-k 1% + int8, a loaded machine), the compressed step took 0.082 s
at 1 ms and 0.160 s at 20 ms, about four cycles per step. So the rule below picks the SHORTEST
cycle from a ladder that keeps idle coordination under 20% of the narrower direction of the
link: 1 ms (Horovod's default) on fast links, 5 ms on LTE, 50 ms on slow 4G, 1 s on NB-IoT.
"""

from __future__ import annotations

import math

HOROVOD_DEFAULT_CYCLE_TIME_MS = 1.0
# Frame bytes one device sends per coordination cycle, what the rule plans with; the bench
# (`globaldl bench coordination`) reports whether it covers the busiest rank it measured.
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


def measured_coordination_text() -> str:
    """One sentence on the committed idle-coordination measurement, or that there is none."""
    from globaldl.fleet.calibration import DEFAULT_CALIBRATION_PATH, load_calibrations

    calibrations = sorted(load_calibrations(), key=lambda c: (c.idle.ranks, c.idle.cycle_time_ms))
    if not calibrations:
        return (
            "Idle coordination has not been measured on this machine yet: "
            "`globaldl bench coordination` measures it per device count and cycle time."
        )
    figures = "; ".join(
        f"{c.idle.ranks} devices at {c.idle.cycle_time_ms:g} ms: "
        f"{c.idle.mean_tx_bytes_per_second / 1000:.1f} kB/s per device "
        f"({c.idle.max_tx_bytes_per_cycle:.0f} B per cycle on the busiest rank)"
        for c in calibrations
    )
    return (
        f"Idle coordination measured by `globaldl bench coordination` "
        f"({DEFAULT_CALIBRATION_PATH.parent.name}/{DEFAULT_CALIBRATION_PATH.name}, frame bytes "
        f"on each device's uplink): {figures}."
    )
