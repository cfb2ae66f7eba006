"""Experiments on the emulated fleet: the papers' tables, produced by globaldl's own runs."""

from __future__ import annotations

from typing import Any

from globaldl.experiments.ablation import AblationExperiment, Variant
from globaldl.experiments.analysis import TargetCheck, time_to_target
from globaldl.experiments.balance import BalanceExperiment
from globaldl.experiments.bottleneck import BottleneckExperiment
from globaldl.experiments.chaos import ChaosExperiment
from globaldl.experiments.devices import DevicesExperiment, Schedule
from globaldl.experiments.experiment import (
    Experiment,
    ExperimentReport,
    run_experiment,
    write_outputs,
)
from globaldl.experiments.latency import LatencyExperiment
from globaldl.experiments.learning import LearningExperiment, LearningWorkload
from globaldl.experiments.recovery import RecoveryExperiment
from globaldl.experiments.resources import ResourcesExperiment
from globaldl.experiments.rounds import RoundsExperiment
from globaldl.experiments.runner import ExperimentRunner, RunResult
from globaldl.experiments.scale import ScaleExperiment
from globaldl.experiments.scaling import ScalingExperiment
from globaldl.experiments.sites import SitesExperiment
from globaldl.experiments.spec import FleetConfig, RunSpec, Workload

EXPERIMENTS: dict[str, type[Experiment]] = {
    "devices": DevicesExperiment,
    "resources": ResourcesExperiment,
    "ablation": AblationExperiment,
    "bottleneck": BottleneckExperiment,
    "recovery": RecoveryExperiment,
    "chaos": ChaosExperiment,
    "balance": BalanceExperiment,
    "rounds": RoundsExperiment,
    "latency": LatencyExperiment,
    "scale": ScaleExperiment,
    "sites": SitesExperiment,
    "scaling": ScalingExperiment,
    "learning": LearningExperiment,
}


def get(identifier: str | Experiment, **options: Any) -> Experiment:
    """An experiment from its name (built with `options`) or an Experiment instance."""
    if isinstance(identifier, Experiment):
        return identifier
    try:
        experiment_class = EXPERIMENTS[identifier]
    except (KeyError, TypeError):
        raise ValueError(
            f"experiment {identifier!r} is not one of: {', '.join(EXPERIMENTS)}"
        ) from None
    return experiment_class(**options)


__all__ = [
    "EXPERIMENTS",
    "AblationExperiment",
    "BalanceExperiment",
    "BottleneckExperiment",
    "ChaosExperiment",
    "DevicesExperiment",
    "Experiment",
    "ExperimentReport",
    "ExperimentRunner",
    "FleetConfig",
    "LatencyExperiment",
    "LearningExperiment",
    "LearningWorkload",
    "RecoveryExperiment",
    "ResourcesExperiment",
    "RoundsExperiment",
    "RunResult",
    "RunSpec",
    "ScaleExperiment",
    "ScalingExperiment",
    "Schedule",
    "SitesExperiment",
    "TargetCheck",
    "Variant",
    "Workload",
    "get",
    "run_experiment",
    "time_to_target",
    "write_outputs",
]
