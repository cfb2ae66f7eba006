"""Project a model's training to many devices: step time, time to accuracy, bytes, crossovers.

Per model the fleet's runs give what the simulator does not: payload bytes per codec, compute
time per step at a CPU share (and the per-peer decode cost of gathered payloads), and steps to
the target accuracy. The simulator gives the exchange on the projected platform.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from globaldl.fleet.profiles import LinkProfile
from globaldl.simulate.calibration import SimParameters
from globaldl.simulate.exchange import (
    ExchangeMode,
    StepEstimate,
    Workload,
    estimate_step,
    plan_network,
    simulate_plans,
)
from globaldl.simulate.fleetdata import Observation
from globaldl.simulate.platform import Device, Fleet, LinkMix, Site, link_directions

GATHER_CODEC = "topk0.01+int8"


@dataclass(frozen=True)
class ModeSpec:
    """A projected exchange mode: how it runs and which measured codec it stands for."""

    mode: ExchangeMode
    codec: str  # the fleet codec whose payload and convergence it uses
    payload_factor: float = 1.0  # payload relative to that codec's measured bytes


def default_modes(local_steps: int) -> dict[str, ModeSpec]:
    """The exchange modes a projection compares."""
    return {
        "dense": ModeSpec(ExchangeMode("dense"), "none"),
        "fp16-sum": ModeSpec(ExchangeMode("fp16-sum"), "fp16"),
        "gather": ModeSpec(ExchangeMode("gather", combine="gather"), GATHER_CODEC),
        "hierarchical": ModeSpec(ExchangeMode("hierarchical", hierarchy="sites"), "fp16"),
        "local": ModeSpec(ExchangeMode("local", local_steps=local_steps, overlap=True), "fp16"),
    }


@dataclass(frozen=True)
class ModelProfile:
    """What the fleet measured for one model and codec."""

    model: str
    codec: str
    payload_bytes: float
    base_cpu_seconds: float  # non-exchange CPU-seconds per step, decode of peers excluded
    decode_cpu_seconds_per_peer: float
    steps_to_target: float | None
    steps_source: str
    local_batch_size: int


def model_profile(
    observations: Sequence[Observation], model: str, codec: str, target_accuracy: float
) -> ModelProfile:
    """Median measurements of `model` with `codec` over every run that used them."""
    runs = [item for item in observations if item.model == model and item.codec == codec]
    if not runs:
        have = sorted({(item.model, item.codec) for item in observations})
        raise ValueError(f"no fleet run measured model {model!r} with codec {codec!r}; have {have}")
    gathered = [item for item in runs if item.combine == "gather" and item.ranks > 1]
    per_peer = (
        float(
            np.median(
                [
                    item.decompress_seconds * min(item.cpu_cores) / (item.ranks - 1)
                    for item in gathered
                ]
            )
        )
        if gathered
        else 0.0
    )
    # CPU-seconds per step at the run's share; a gathered payload's decode is counted per peer.
    base = [
        (item.compute_seconds - (item.decompress_seconds if item.combine == "gather" else 0.0))
        * min(item.cpu_cores)
        for item in runs
    ]
    steps, source = _steps_to_target(runs, target_accuracy)
    return ModelProfile(
        model=model,
        codec=codec,
        payload_bytes=float(np.median([item.payload_bytes for item in runs])),
        base_cpu_seconds=float(np.median(base)),
        decode_cpu_seconds_per_peer=per_peer,
        steps_to_target=steps,
        steps_source=source,
        local_batch_size=int(np.median([item.batch_size for item in runs])),
    )


def _steps_to_target(
    runs: Sequence[Observation], target_accuracy: float
) -> tuple[float | None, str]:
    """Steps to the target in the run with the most devices that reached it (none: None)."""
    for item in sorted(runs, key=lambda run: run.ranks, reverse=True):
        epochs = len(item.history)
        if not epochs:
            continue
        steps_per_epoch = item.steps / epochs
        for entry in item.history:
            if float(entry.get("val_accuracy", 0.0)) >= target_accuracy:
                return float(entry["epoch"]) * steps_per_epoch, f"{item.key} ({item.ranks} devices)"
    return None, "no fleet run reached the target"


@dataclass(frozen=True)
class ProjectionRequest:
    """What to project."""

    devices: tuple[int, ...]
    mix: LinkMix
    model: str
    cpu_cores: float = 0.5
    site_size: int = 0  # 0: no sites
    site_profile: LinkProfile | None = None
    local_steps: int = 8
    target_accuracy: float = 0.9
    steps: int = 100
    cycle_time_seconds: float | None = None  # None: the fleet's rule per narrowest link
    gloo_timeout_seconds: float = 30.0
    modes: tuple[str, ...] = ("dense", "fp16-sum", "gather", "hierarchical", "local")


def build_fleet(
    request: ProjectionRequest, devices: int, profiles: Mapping[str, LinkProfile]
) -> Fleet:
    """The projected fleet: the mix's devices, grouped into sites of `site_size` if asked."""
    fleet = request.mix.fleet(devices, profiles, request.cpu_cores)
    if request.site_size <= 0 or request.site_profile is None:
        return fleet
    up, down = link_directions(request.site_profile)
    count = math.ceil(devices / request.site_size)
    sites = tuple(Site(f"site-{index}", up, down) for index in range(count))
    grouped = tuple(
        Device(device.profile, device.cpu_cores, device.speed, index // request.site_size)
        for index, device in enumerate(fleet.devices)
    )
    return Fleet(grouped, sites)


def cycle_time_seconds(request: ProjectionRequest, fleet: Fleet) -> float:
    """HOROVOD_CYCLE_TIME as the fleet chooses it: by the narrowest link of any device."""
    if request.cycle_time_seconds is not None:
        return request.cycle_time_seconds
    from globaldl.experiments.cycle_time import auto_cycle_time_ms

    narrowest_up = min(device.up.kbit_per_second for device in fleet.devices)
    narrowest_down = min(device.down.kbit_per_second for device in fleet.devices)
    return auto_cycle_time_ms(narrowest_up, narrowest_down) / 1000


def project(
    request: ProjectionRequest,
    observations: Sequence[Observation],
    parameters: SimParameters,
    profiles: Mapping[str, LinkProfile],
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (devices, mode): step time, time to accuracy, bytes, timeouts."""
    exchange_parameters = parameters.exchange_parameters(request.gloo_timeout_seconds)
    specs = default_modes(request.local_steps)
    unknown = sorted(set(request.modes) - set(specs))
    if unknown:
        raise ValueError(f"unknown exchange modes {unknown}; valid: {sorted(specs)}")
    rows: list[dict[str, Any]] = []
    for devices in request.devices:
        fleet = build_fleet(request, devices, profiles)
        cycle = cycle_time_seconds(request, fleet)
        cases = []
        for name in request.modes:
            spec = specs[name]
            if spec.mode.hierarchy == "sites" and not fleet.sites:
                continue
            profile = model_profile(
                observations, request.model, spec.codec, request.target_accuracy
            )
            payload = profile.payload_bytes * spec.payload_factor
            cases.append((name, spec, profile, payload))
        plans = [plan_network(fleet, spec.mode, payload) for _, spec, _, payload in cases]
        networks = simulate_plans(plans, exchange_parameters)
        for (name, spec, profile, payload), network in zip(cases, networks, strict=True):
            compute = _compute_seconds(fleet, profile, spec.mode)
            estimate = estimate_step(
                fleet, spec.mode, Workload(payload, cycle, compute), exchange_parameters, network
            )
            rows.append(_row(request, devices, name, spec, profile, payload, cycle, estimate))
        if progress is not None:
            progress(f"{devices} devices: {len(cases)} exchange modes simulated")
    return rows


def _compute_seconds(fleet: Fleet, profile: ModelProfile, mode: ExchangeMode) -> np.ndarray:
    peers = fleet.size - 1 if mode.combine == "gather" else 0
    cpu = profile.base_cpu_seconds + profile.decode_cpu_seconds_per_peer * peers
    shares = np.array([device.cpu_cores * device.speed for device in fleet.devices])
    return cpu / shares


def _row(
    request: ProjectionRequest,
    devices: int,
    name: str,
    spec: ModeSpec,
    profile: ModelProfile,
    payload: float,
    cycle: float,
    estimate: StepEstimate,
) -> dict[str, Any]:
    steps = profile.steps_to_target
    measured_steps = steps is not None and spec.mode.local_steps == 1
    examples_per_second = devices * profile.local_batch_size / estimate.step_seconds
    return {
        "devices": devices,
        "mode": name,
        "codec": profile.codec,
        "payload_bytes": payload,
        "cycle_time_ms": cycle * 1000,
        "step_seconds": estimate.step_seconds,
        "exchange_seconds": estimate.exchange_seconds,
        "coordination_seconds": estimate.coordination_seconds,
        "collective_seconds": estimate.collective_seconds,
        "compute_seconds": estimate.compute_seconds,
        "seconds_for_steps": estimate.step_seconds * request.steps,
        "examples_per_second": examples_per_second,
        "device_tx_bytes_per_step": estimate.device_tx_bytes_per_step,
        "max_device_tx_bytes_per_step": estimate.max_device_tx_bytes_per_step,
        "steps_to_target": steps if measured_steps else None,
        "seconds_to_target": estimate.step_seconds * steps if measured_steps else None,
        "steps_source": profile.steps_source if measured_steps else "not measured for this H",
        "times_out": estimate.timed_out,
        "timeout_reason": estimate.timeout_reason,
    }


def crossovers(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: the largest device count that still adds throughput and does not time out."""
    result = []
    for mode in sorted({row["mode"] for row in rows}):
        series = sorted(
            (row for row in rows if row["mode"] == mode), key=lambda row: row["devices"]
        )
        running = [row for row in series if not row["times_out"]]
        best = max(running, key=lambda row: row["examples_per_second"], default=None)
        first_timeout = next((row["devices"] for row in series if row["times_out"]), None)
        result.append(
            {
                "mode": mode,
                "best_devices": best["devices"] if best else None,
                "best_examples_per_second": best["examples_per_second"] if best else None,
                "stops_paying_off_after_devices": best["devices"] if best else None,
                "first_timeout_devices": first_timeout,
            }
        )
    return result
