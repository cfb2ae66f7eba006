"""The fleet's committed runs as observations the simulator can be calibrated and checked on.

Every `results/experiments/*/*.json` holds each run's summary (phase times, bytes handed to
Horovod, steps, accuracy history), its link profile, cycle time and byte accounting. A run
becomes an `Observation`: the configuration the simulator needs and the step time it must hit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from globaldl.fleet.profiles import LinkProfile

DEFAULT_RESULTS_DIR = Path(__file__).resolve().parents[2] / "results" / "experiments"
EXCHANGE_PHASE = "exchange"
# Codecs whose payloads Horovod sums with allreduce; every other codec is gathered.
SUMMABLE_QUANTIZERS = ("none", "fp16")


@dataclass(frozen=True, eq=False)
class Observation:
    """One fleet run: its configuration and its measured step."""

    experiment: str
    label: str
    model: str
    ranks: int
    profile: LinkProfile
    cpu_cores: tuple[float, ...]
    cycle_time_seconds: float
    combine: str
    payload_bytes: float
    compute_seconds: float
    step_seconds: float
    steps: int
    history: tuple[dict[str, Any], ...]
    codec: str
    batch_size: int
    decompress_seconds: float
    gradient_bytes_raw_per_step: float

    @property
    def key(self) -> str:
        """`experiment/label`, unique across the results."""
        return f"{self.experiment}/{self.label}"

    def compute_seconds_per_device(self) -> np.ndarray:
        """Each device's non-exchange time per step: rank 0's, scaled by CPU share.

        Only rank 0's phases are in the summary; a device with a smaller CPU share is assumed
        to do the same work proportionally slower.
        """
        shares = np.asarray(self.cpu_cores, float)
        return self.compute_seconds * shares[0] / shares


def _codec(compression: dict[str, Any]) -> str:
    prune = compression.get("prune", "none")
    quantize = compression.get("quantize", "none")
    if prune == "none":
        return quantize
    density = compression.get("density")
    return f"{prune}{density:g}+{quantize}" if quantize != "none" else f"{prune}{density:g}"


def observation_from_run(experiment: str, run: dict[str, Any]) -> Observation | None:
    """The observation of one run, or None when the run cannot be one (failed, faults, 1 rank)."""
    summary = run.get("summary") or {}
    steps = int(summary.get("steps") or 0)
    phases = summary.get("phase_seconds") or {}
    if run.get("status") != "ok" or run.get("faults") or steps <= 0 or EXCHANGE_PHASE not in phases:
        return None
    ranks = int(summary.get("ranks") or 0)
    link = dict(run.get("link") or {})
    if not link or ranks < 1:
        return None
    profile = LinkProfile(**link)
    if not run.get("latency_emulated", False):
        # The fleet shaped rates only: latency, jitter and loss in the profile never happened.
        profile = profile.rates_only()
    fleet = run.get("spec", {}).get("fleet", {})
    shares = fleet.get("cpu_cores_each") or [fleet.get("cpu_cores_per_device") or 1.0] * ranks
    compression = summary.get("compression") or {}
    codec = _codec(compression)
    summable = (
        compression.get("prune", "none") == "none"
        and compression.get("quantize", "none") in SUMMABLE_QUANTIZERS
    )
    compute = sum(seconds for name, seconds in phases.items() if name != EXCHANGE_PHASE)
    return Observation(
        experiment=experiment,
        label=str(run.get("spec", {}).get("label") or run.get("run_id")),
        model=_model_name(summary),
        ranks=ranks,
        profile=profile,
        cpu_cores=tuple(float(share) for share in shares[:ranks]),
        cycle_time_seconds=float(run.get("cycle_time_ms") or 1.0) / 1000,
        combine="sum" if summable else "gather",
        payload_bytes=float(summary["gradient_bytes_wire"]) / steps,
        compute_seconds=compute / steps,
        step_seconds=sum(phases.values()) / steps,
        steps=steps,
        history=tuple(summary.get("history") or ()),
        codec=codec,
        batch_size=int(summary.get("global_batch_size", 0)) // max(ranks, 1),
        decompress_seconds=float(phases.get("decompress", 0.0)) / steps,
        gradient_bytes_raw_per_step=float(summary.get("gradient_bytes_raw", 0)) / steps,
    )


def _model_name(summary: dict[str, Any]) -> str:
    model = str(summary.get("model", "?"))
    options = summary.get("model_options") or {}
    if model == "resnet":
        return f"resnet-{options.get('depth', '?')}"
    if model == "mlp":
        return f"mlp-{options.get('layers', '?')}x{options.get('width', '?')}"
    return model


def load_observations(
    results_dir: Path = DEFAULT_RESULTS_DIR, experiments: Iterable[str] | None = None
) -> list[Observation]:
    """Every usable run under `results_dir` (only the named experiments when given)."""
    wanted = set(experiments) if experiments is not None else None
    observations: list[Observation] = []
    for path in sorted(Path(results_dir).glob("*/*.json")):
        document = json.loads(path.read_text())
        if not isinstance(document, dict) or "runs" not in document:
            continue
        experiment = str((document.get("experiment") or {}).get("name") or path.parent.name)
        if wanted is not None and experiment not in wanted:
            continue
        for run in document["runs"]:
            observation = observation_from_run(experiment, run)
            if observation is not None:
                observations.append(observation)
    return observations
