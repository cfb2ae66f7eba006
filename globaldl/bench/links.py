"""`globaldl bench links`: every profile's emulated link against its profile, and its CPU cost.

One fleet holds two devices per profile (so one `fleet up`); each repeat measures, profile
after profile (interleaved), the path from the first device of a pair to the second: round
trip and loss with UDP probes, then a bulk TCP rate, and the CPU the vde2 processes spent
meanwhile (they run outside every device's quota). Figures are medians over the repeats with
their min-max; each is checked against what the profiles promise (within 10%).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from globaldl.bench.results import spread
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.linkcheck import measure_path
from globaldl.fleet.plan import plan_from_options
from globaldl.fleet.profiles import load_profiles

PROFILES: tuple[str, ...] = ("fibre", "lte", "slow-4g", "lte-m", "geo-satellite", "nb-iot")
# A bulk TCP transfer at 26 kbit/s across a 23 s round trip does not leave slow start in any
# bounded time: NB-IoT gets round trips only.
ROUND_TRIP_ONLY: tuple[str, ...] = ("nb-iot",)
NB_IOT_PROBES = 12
TOLERANCE = 0.10
DEFAULT_STATE_DIR = Path("/run/globaldl-bench-links")
DEFAULT_PREFIX = "gdlb"
DEFAULT_SUBNET = "10.79.0.0/24"


def measure_links(
    profiles: Sequence[str] = PROFILES,
    *,
    repeats: int = 3,
    seconds: float = 5.0,
    state_dir: Path = DEFAULT_STATE_DIR,
    prefix: str = DEFAULT_PREFIX,
    subnet: str = DEFAULT_SUBNET,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """One row per profile: measured and promised round trip, loss, rate; forwarding CPU."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    fleet = Fleet(state_dir)
    plan = plan_from_options(
        load_profiles(),
        mix=",".join(f"{name}:2" for name in profiles),
        prefix=prefix,
        subnet=subnet,
        memory_mb=256,
    )
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in profiles}
    fleet.up(plan, latency="require", log=progress)
    try:
        state = fleet.require_state()
        for repeat in range(1, repeats + 1):
            for index, name in enumerate(profiles):
                source, target = plan.devices[2 * index].name, plan.devices[2 * index + 1].name
                slow = name in ROUND_TRIP_ONLY
                measured = measure_path(
                    state,
                    source,
                    target,
                    seconds=seconds,
                    probes=NB_IOT_PROBES if slow else None,
                    rate=not slow,
                )
                samples[name].append(measured)
                progress(f"[{repeat}/{repeats}] {name}: {_short(measured)}")
    finally:
        fleet.down(log=progress)
    return [_row(name, samples[name]) for name in profiles]


def _short(measured: dict[str, Any]) -> str:
    median = measured["round_trip"]["round_trip_ms_median"]
    text = f"round trip {median:.1f} ms" if median is not None else "no echo came back"
    if "rate" in measured:
        text += f", {measured['rate']['frame_bits_per_second'] / 1e6:.3f} Mbit/s"
    return text


def _row(name: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    round_trips = [s["round_trip"] for s in samples]
    rtt = spread([r["round_trip_ms_median"] for r in round_trips if r["round_trip_ms_median"]])
    expected_rtt = round_trips[0]["expected_round_trip_ms"]
    loss = spread([r["forward_loss_fraction"] for r in round_trips])
    row: dict[str, Any] = {
        "profile": name,
        "round_trip_ms": rtt["median"],
        "round_trip_ms_min": rtt["min"],
        "round_trip_ms_max": rtt["max"],
        "round_trip_expected_ms": expected_rtt,
        "round_trip_error": rtt["median"] / expected_rtt - 1 if rtt["median"] else None,
        "loss_fraction": loss["median"],
        "loss_expected_fraction": round_trips[0]["expected_forward_loss_fraction"],
        "probes_per_repeat": round_trips[0]["probes_sent"],
        "repeats": len(samples),
    }
    rates = [s for s in samples if "rate" in s]
    if rates:
        rate = spread([s["rate"]["frame_bits_per_second"] / 1e6 for s in rates])
        shaped = rates[0]["rate"]["shaped_bits_per_second"] / 1e6
        cores = spread([s["emulation_cpu_cores"] for s in rates if s["emulation_cpu_cores"]])
        row.update(
            {
                "rate_mbit_per_second": rate["median"],
                "rate_mbit_per_second_min": rate["min"],
                "rate_mbit_per_second_max": rate["max"],
                "rate_shaped_mbit_per_second": shaped,
                "rate_error": rate["median"] / shaped - 1,
                "emulation_cpu_cores": cores["median"],
                "emulation_cpu_cores_min": cores["min"],
                "emulation_cpu_cores_max": cores["max"],
                "emulation_cpu_cores_per_mbit": (
                    cores["median"] / rate["median"] if cores["median"] else None
                ),
            }
        )
    row["within_10_percent"] = all(
        error is not None and abs(error) <= TOLERANCE
        for error in (row["round_trip_error"], row.get("rate_error", 0.0))
    )
    return row


COLUMNS = (
    "profile",
    "round_trip_ms",
    "round_trip_expected_ms",
    "round_trip_error",
    "loss_fraction",
    "rate_mbit_per_second",
    "rate_shaped_mbit_per_second",
    "rate_error",
    "emulation_cpu_cores",
    "emulation_cpu_cores_per_mbit",
    "within_10_percent",
)

NOTES = (
    "Each profile: device 1 -> device 2 -> device 1 of a pair on that profile (two access "
    "links, each crossed both ways). Round trip: median of UDP probes per repeat, median over "
    "repeats (min-max in the JSON); expected: the profiles' delays plus serialisation of the "
    "106-byte probe frames at each shaped hop. Rate: bulk TCP, Ethernet-frame bits per second "
    "after a 0.5 s warm-up; shaped: the narrowest link on the path. `emulation_cpu_cores`: CPU "
    "of the fleet's vde2 processes (cgroup `<prefix>-fleet/emulation`, cpuacct) during the bulk "
    "transfer, over its wall time; it is the cost of the user-space links at that rate, paid "
    "outside the devices' CPU quotas. NB-IoT gets round trips only (12 probes, spaced beyond "
    "its jitter). Target: every measured figure within 10% of the profile."
)
