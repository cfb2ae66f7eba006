"""Measure a fleet path end to end: round trip and loss, then the rate, and the forwarding CPU.

`globaldl fleet measure` prints it; experiments call it while a run trains (a `measure`
fault) to check that the user-space links still deliver their profiles under load.
"""

from __future__ import annotations

import random
import time
from typing import Any

from globaldl.fleet.cgroups import emulation_cpu_seconds
from globaldl.fleet.measure import measure_throughput
from globaldl.fleet.paths import HOST, fleet_path
from globaldl.fleet.probe import measure_round_trip
from globaldl.fleet.state import FleetState


def _free_port() -> int:
    # Random high ports: other fleets and engineers share this machine.
    return random.randint(20000, 60000)


def measure_path(
    state: FleetState,
    source: str,
    target: str,
    *,
    seconds: float = 4.0,
    probes: int | None = None,
    interval_ms: float | None = None,
    round_trip: bool = True,
    rate: bool = True,
) -> dict[str, Any]:
    """Round trip and loss (UDP probes), then a bulk TCP rate, of the path `source` -> `target`.

    `target` may be `host` (the core). Every figure comes with what the profiles promise; the
    rate comes with the CPU the link emulation spent meanwhile (`emulation_cpu_cores`).
    """
    if source == HOST:
        raise ValueError(f"the source must be a device; `{HOST}` can only be the target")
    path = fleet_path(state, source, target)
    target_netns = None if target == HOST else target
    result: dict[str, Any] = {"from": source, "to": target}
    if round_trip:
        result["round_trip"] = measure_round_trip(
            path,
            source_netns=source,
            target_netns=target_netns,
            port=_free_port(),
            probes=probes,
            interval_ms=interval_ms,
        ).to_dict()
    if rate:
        cpu_before, started = emulation_cpu_seconds(state.prefix), time.monotonic()
        measured = measure_throughput(
            source,
            target,
            path.target_address,
            path.rate_bits_per_second,
            seconds=seconds,
            port=_free_port(),
            sender_netns=source,
            receiver_netns=target_netns,
        )
        elapsed, cpu_after = time.monotonic() - started, emulation_cpu_seconds(state.prefix)
        result["rate"] = measured.to_dict()
        result["emulation_cpu_cores"] = (
            (cpu_after - cpu_before) / elapsed
            if cpu_before is not None and cpu_after is not None
            else None
        )
    return result
