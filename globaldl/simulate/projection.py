"""Project a model's training to many devices: step time, time to accuracy, bytes, crossovers.

Per model the fleet's runs give what the simulator does not: payload bytes per codec, CPU time
per step (and the per-peer decode of gathered payloads), and steps to the target accuracy. The
simulator gives the exchange on the projected platform: SimGrid once per device count (every
exchange mode's messages on one platform), then the reduced step model per mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from globaldl.balance import split_batch
from globaldl.compression.lanes import lane_bits_for, lane_word, packed_bytes, word_bytes
from globaldl.fleet.profiles import LinkProfile
from globaldl.simulate.calibration import SimParameters
from globaldl.simulate.exchange import ExchangeMode, plan_network, simulate_transfers
from globaldl.simulate.fleetdata import Observation
from globaldl.simulate.platform import Device, Fleet, LinkMix, Site, SpeedMix, link_directions
from globaldl.simulate.steps import StepEstimate, Workload, simulate_steps

GATHER_CODEC = "topk0.01+int8"
# Issue 12's summable two-step compression: shared top-k, integer codes summed in lanes.
SPARSE_SUM_CODEC = "shared-topk0.01+intsum"
# A mode still pays off at a device count when it raises examples per second by at least this
# much over the next smaller projected count (and does not time out).
MIN_GAIN = 0.10
BALANCES = ("equal", "speed")


@dataclass(frozen=True)
class ModeSpec:
    """A projected exchange mode: how it runs and which measured codec it stands for."""

    mode: ExchangeMode
    codec: str  # the fleet codec whose payload, CPU and convergence it uses


def default_modes(local_steps: int) -> dict[str, ModeSpec]:
    """The exchange modes a projection compares."""
    return {
        "dense": ModeSpec(ExchangeMode("dense"), "none"),
        "fp16-sum": ModeSpec(ExchangeMode("fp16-sum"), "fp16"),
        "gather": ModeSpec(ExchangeMode("gather", combine="gather"), GATHER_CODEC),
        "sparse-sum": ModeSpec(ExchangeMode("sparse-sum"), SPARSE_SUM_CODEC),
        "hierarchical": ModeSpec(ExchangeMode("hierarchical", hierarchy="sites"), "fp16"),
        # The fleet measured local steps with dense deltas summed (its convergence at H = 16
        # and 64, with and without overlap) and with gathered top-k + int8, which does not
        # stay flat per device; fp16 deltas it did not measure.
        "local": ModeSpec(ExchangeMode("local", local_steps=local_steps, overlap=True), "none"),
    }


@dataclass(frozen=True)
class ModelProfile:
    """What the fleet measured for one model and codec."""

    model: str
    codec: str
    payload_bytes: float
    base_cpu_seconds: float  # CPU per step at full speed, decode of peers' payloads excluded
    batch_share: float  # the part of base_cpu_seconds that grows with the local batch
    decode_cpu_seconds_per_peer: float
    steps_to_target: float | None
    examples_to_target: float | None
    steps_source: str
    local_batch_size: int
    lane_bits: int = 0  # integer sums: the measured runs' lane width (0: no integer sum)

    def payload_at(self, ranks: int) -> float:
        """One device's payload per exchange on `ranks` devices.

        An integer sum's lanes must hold the sum of every rank's codes: beyond the ranks the
        measured lanes can sum, the codec needs wider ones (`--sum-bits`), and its payload
        grows with them (`globaldl.compression.lanes`). Other payloads do not depend on N.
        """
        if not self.lane_bits:
            return self.payload_bytes
        _, lanes_per_word = lane_word(self.lane_bits)
        lanes = round(self.payload_bytes / word_bytes(self.lane_bits) * lanes_per_word)
        return float(packed_bytes(lanes, lane_bits_for(ranks, self.lane_bits)))


def model_profile(
    observations: Sequence[Observation],
    model: str,
    codec: str,
    target_accuracy: float,
    local_steps: int = 1,
    overlap: bool = False,
) -> ModelProfile:
    """Median measurements of `model` with `codec` over every run that used them.

    Payload and CPU a step come from every such run; the steps to the target only from the runs
    that exchanged as the projected mode does: every `local_steps` steps, overlapped or not.
    """
    runs = [item for item in observations if item.model == model and item.codec == codec]
    if not runs:
        have = sorted({(item.model, item.codec) for item in observations})
        raise ValueError(f"no fleet run measured model {model!r} with codec {codec!r}; have {have}")
    gathered = [item for item in runs if item.combine == "gather" and item.ranks > 1]
    # A gathered payload is decoded once per peer: the decompress phase's share of the CPU.
    per_peer = [
        item.compute_cpu_seconds[0]
        * item.decompress_seconds
        / max(item.compute_wall_seconds, 1e-12)
        / (item.ranks - 1)
        for item in gathered
    ]
    decode = float(np.median(per_peer)) if per_peer else 0.0
    base = [
        item.compute_cpu_seconds[0] - (decode * (item.ranks - 1) if item in gathered else 0.0)
        for item in runs
    ]
    alike = [
        item
        for item in runs
        if item.local_steps == local_steps and (local_steps == 1 or item.overlap == overlap)
    ]
    steps, examples, source = _to_target(alike, target_accuracy, local_steps, overlap)
    batch_share = np.median(
        [item.batch_cpu_seconds / max(item.compute_cpu_seconds[0], 1e-12) for item in runs]
    )
    return ModelProfile(
        model=model,
        codec=codec,
        payload_bytes=float(np.median([item.payload_bytes for item in runs])),
        base_cpu_seconds=max(float(np.median(base)), 0.0),
        batch_share=float(np.clip(batch_share, 0.0, 1.0)),
        decode_cpu_seconds_per_peer=decode,
        steps_to_target=steps,
        examples_to_target=examples,
        steps_source=source,
        local_batch_size=int(np.median([item.batch_size for item in runs])),
        lane_bits=max(item.lane_bits for item in runs),
    )


def _to_target(
    runs: Sequence[Observation], target_accuracy: float, local_steps: int, overlap: bool
) -> tuple[float | None, float | None, str]:
    """Steps and examples to the target in the run with most devices that reached it."""
    for item in sorted(runs, key=lambda run: run.ranks, reverse=True):
        epochs = len(item.history)
        if not epochs:
            continue
        steps_per_epoch = item.steps / epochs
        for entry in item.history:
            if float(entry.get("val_accuracy", 0.0)) >= target_accuracy:
                steps = float(entry["epoch"]) * steps_per_epoch
                examples = steps * sum(item.batch_sizes)
                return steps, examples, f"{item.key} ({item.ranks} devices)"
    exchange = "every step" if local_steps == 1 else f"every {local_steps} steps"
    exchange += ", overlapped" if local_steps > 1 and overlap else ""
    return None, None, f"no fleet run exchanging {exchange} reached the target"


@dataclass(frozen=True)
class ProjectionRequest:
    """What to project."""

    devices: tuple[int, ...]
    mix: LinkMix
    model: str
    cpu_cores: float = 0.5
    speeds: SpeedMix = field(default_factory=SpeedMix.uniform)  # the devices' CPU speeds
    balance: str = "equal"  # local batches: "equal", or "speed" as `--balance speed` splits them
    site_size: int = 0  # 0: no sites
    site_profile: LinkProfile | None = None
    local_steps: int = 16  # dense deltas: the fleet measured H = 16 and 64 (`rounds`, ...)
    target_accuracy: float = 0.9
    steps: int = 100
    cycle_time_seconds: float | None = None  # None: the fleet's rule per narrowest link
    gloo_timeout_seconds: float = 30.0
    modes: tuple[str, ...] = ("dense", "fp16-sum", "gather", "sparse-sum", "hierarchical", "local")

    def __post_init__(self) -> None:
        if not self.devices or any(count < 1 for count in self.devices):
            raise ValueError(f"devices must be positive counts, got {self.devices!r}")
        if not self.cpu_cores > 0:
            raise ValueError(f"cpu_cores must be > 0, got {self.cpu_cores!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps!r}")
        if self.balance not in BALANCES:
            raise ValueError(f"balance must be one of {BALANCES}, got {self.balance!r}")


def build_fleet(
    request: ProjectionRequest, devices: int, profiles: Mapping[str, LinkProfile]
) -> Fleet:
    """The projected fleet: the mix's devices at its speeds, in sites of `site_size` if asked."""
    fleet = request.mix.fleet(devices, profiles, request.cpu_cores)
    speeds = request.speeds.speeds(devices)
    sited = request.site_size > 0 and request.site_profile is not None
    placed = tuple(
        Device(
            device.profile,
            device.cpu_cores,
            float(speed),
            index // request.site_size if sited else -1,
        )
        for index, (device, speed) in enumerate(zip(fleet.devices, speeds, strict=True))
    )
    if not sited:
        return Fleet(placed)
    up, down = link_directions(request.site_profile)
    count = math.ceil(devices / request.site_size)
    return Fleet(placed, tuple(Site(f"site-{index}", up, down) for index in range(count)))


def cycle_time_seconds(request: ProjectionRequest, fleet: Fleet) -> float:
    """HOROVOD_CYCLE_TIME as the fleet chooses it: by the narrowest link of any device."""
    if request.cycle_time_seconds is not None:
        return request.cycle_time_seconds
    from globaldl.fleet.cycle_time import auto_cycle_time_ms

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
    inputs = {
        name: _mode_inputs(observations, request, name, specs[name]) for name in request.modes
    }
    rows: list[dict[str, Any]] = []
    for devices in request.devices:
        fleet = build_fleet(request, devices, profiles)
        cycle = cycle_time_seconds(request, fleet)
        names = [
            name for name in request.modes if specs[name].mode.hierarchy == "none" or fleet.sites
        ]
        plans = [plan_network(fleet, specs[name].mode, inputs[name][1][devices]) for name in names]
        transfers = simulate_transfers(plans, exchange_parameters.tcp)
        for name, phases in zip(names, transfers, strict=True):
            spec = specs[name]
            profile, payloads = inputs[name]
            payload = payloads[devices]
            work = _compute_cpu(fleet, profile, spec, request.balance)
            workload = Workload(payload, cycle, work)
            estimate = simulate_steps(
                fleet,
                spec.mode,
                workload,
                exchange_parameters,
                {phase: value.hops() for phase, value in phases.items()},
                max_steps=request.steps,
            )
            rows.append(_row(request, devices, name, spec, profile, payload, cycle, estimate))
            if progress is not None:
                progress(
                    f"{devices} devices, {name}: {estimate.step_seconds:.3g} s per step "
                    f"({estimate.simulated_steps} steps simulated)"
                )
    return rows


def _mode_inputs(
    observations: Sequence[Observation], request: ProjectionRequest, name: str, spec: ModeSpec
) -> tuple[ModelProfile, dict[int, float]]:
    """What the fleet measured for mode `name`'s codec, and its payload at each device count.

    Refused, naming the mode, when the fleet never ran the model with the codec or when the
    codec cannot run on a projected count.
    """
    codec, mode = spec.codec, spec.mode
    try:
        profile = model_profile(
            observations,
            request.model,
            codec,
            request.target_accuracy,
            mode.local_steps,
            mode.overlap,
        )
    except ValueError as error:
        raise ValueError(
            f"exchange mode {name} stands for codec {codec}: {error}; leave it out "
            "of the modes or measure it on the fleet"
        ) from error
    payloads = {}
    for devices in request.devices:
        try:
            payloads[devices] = profile.payload_at(devices)
        except ValueError as error:
            raise ValueError(
                f"exchange mode {name} ({codec}) cannot run on {devices} devices: {error}; "
                "leave it out of the modes"
            ) from error
    return profile, payloads


def _compute_cpu(
    fleet: Fleet, profile: ModelProfile, spec: ModeSpec, balance: str = "equal"
) -> np.ndarray:
    """Each device's CPU a step at the reference speed (`simulate_steps` divides by its speed).

    With `balance` "speed" the global batch is split as training's `--balance speed` splits it
    (`split_batch`, by each device's examples per second: its speed times its quota), and the
    batch-bound part of a step's CPU follows each device's batch; the rest, and the decode of
    gathered payloads (one per peer), does not.
    """
    peers = fleet.size - 1 if spec.mode.combine == "gather" else 0
    scale = np.ones(fleet.size)
    if balance == "speed":
        rates = [device.speed * device.cpu_cores for device in fleet.devices]
        batches = split_batch(profile.local_batch_size * fleet.size, rates)
        scale = np.asarray(batches, float) / profile.local_batch_size
    base = profile.base_cpu_seconds * (1 - profile.batch_share + profile.batch_share * scale)
    return base + profile.decode_cpu_seconds_per_peer * peers


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
    # The profile's steps to the target come from runs that exchanged as this mode does.
    measured = profile.steps_to_target is not None
    examples_per_second = devices * profile.local_batch_size / estimate.step_seconds
    same_examples = (
        profile.examples_to_target / examples_per_second
        if measured and profile.examples_to_target
        else None
    )
    return {
        "devices": devices,
        "mode": name,
        "codec": profile.codec,
        "payload_bytes": payload,
        "cycle_time_ms": cycle * 1000,
        "step_seconds": estimate.step_seconds,
        "compute_seconds": estimate.compute_seconds,
        "coordination_seconds": estimate.coordination_seconds,
        "collective_seconds": estimate.collective_seconds,
        "cycles_per_step": estimate.cycles_per_step,
        "cpu_seconds_per_step": estimate.cpu_seconds_per_step,
        "seconds_for_steps": estimate.step_seconds * request.steps,
        "examples_per_second": examples_per_second,
        "device_tx_bytes_per_step": estimate.device_tx_bytes_per_step,
        "max_device_tx_bytes_per_step": estimate.max_device_tx_bytes_per_step,
        "steps_to_target": profile.steps_to_target if measured else None,
        "seconds_to_target_same_steps": (
            estimate.step_seconds * profile.steps_to_target if measured else None
        ),
        "seconds_to_target_same_examples": same_examples,
        "target_source": profile.steps_source,
        "longest_wait_seconds": estimate.longest_wait_seconds,
        "longest_wait_in": estimate.longest_wait_in,
        "times_out": estimate.timed_out,
        "timeout_reason": estimate.timeout_reason,
        "simulated_steps": estimate.simulated_steps,
    }


def _pays_off_up_to(
    series: Sequence[Mapping[str, Any] | None],
) -> Mapping[str, Any] | None:
    """The largest count of `series` (smallest count first; None: it does not run) that pays off.

    A count pays off when it runs and its examples per second are at least MIN_GAIN above those
    at the next smaller count (the smallest pays off when it runs at all); the first count that
    does not ends the walk.
    """
    pays_off = None
    for point in series:
        if point is None or (
            pays_off is not None
            and point["examples_per_second"] < (1 + MIN_GAIN) * pays_off["examples_per_second"]
        ):
            break
        pays_off = point
    return pays_off


def crossovers(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: up to how many devices it pays off, and where it first times out.

    A count pays off when the run does not time out and its examples per second are at least
    MIN_GAIN above those at the next smaller projected count (the smallest count pays off when
    it runs at all).
    """
    result = []
    for mode in sorted({row["mode"] for row in rows}):
        series = sorted(
            (row for row in rows if row["mode"] == mode), key=lambda row: row["devices"]
        )
        pays_off = _pays_off_up_to([None if row["times_out"] else row for row in series])
        first_timeout = next((row["devices"] for row in series if row["times_out"]), None)
        result.append(
            {
                "mode": mode,
                "pays_off_up_to_devices": pays_off["devices"] if pays_off else None,
                "examples_per_second_there": pays_off["examples_per_second"] if pays_off else None,
                "step_seconds_there": pays_off["step_seconds"] if pays_off else None,
                "first_timeout_devices": first_timeout,
                "longest_wait_seconds_at_largest": series[-1]["longest_wait_seconds"],
            }
        )
    return result


def best_modes(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per device count, the mode with most examples per second that does not time out."""
    result = []
    for devices in sorted({row["devices"] for row in rows}):
        running = [row for row in rows if row["devices"] == devices and not row["times_out"]]
        best = max(running, key=lambda row: row["examples_per_second"], default=None)
        result.append(
            {
                "devices": devices,
                "best_mode": best["mode"] if best else None,
                "examples_per_second": best["examples_per_second"] if best else None,
                "step_seconds": best["step_seconds"] if best else None,
                # With the fleet's steps to the target (None where it did not measure them).
                "seconds_to_target": best.get("seconds_to_target_same_steps") if best else None,
            }
        )
    return result


def answer(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The largest device count that pays off, and the mode it needs there.

    Each count is judged by its best mode (`best_modes`): more devices pay off only while the
    best a run can do with them gains MIN_GAIN examples per second over the best with the next
    smaller count. A slow mode that still gains from its own small base does not count.
    """
    chosen = _pays_off_up_to(
        [None if best["best_mode"] is None else best for best in best_modes(rows)]
    )
    return {
        "devices": chosen["devices"] if chosen else None,
        "mode": chosen["best_mode"] if chosen else None,
        "step_seconds": chosen["step_seconds"] if chosen else None,
        "examples_per_second": chosen["examples_per_second"] if chosen else None,
        "seconds_to_target": chosen["seconds_to_target"] if chosen else None,
    }
