"""Monitoring for globaldl: worker exporters, Prometheus control, dashboards and the run report."""

from globaldl.monitoring.exporter import PrometheusExporter, start_exporter
from globaldl.monitoring.metrics import LABEL_NAMES, TrainingMetrics
from globaldl.monitoring.observer import NullObserver, TrainingObserver
from globaldl.monitoring.phases import PHASES, bottleneck_phase, phase_shares
from globaldl.monitoring.server import MetricsPortInUseError

__all__ = [
    "LABEL_NAMES",
    "PHASES",
    "MetricsPortInUseError",
    "NullObserver",
    "PrometheusExporter",
    "TrainingMetrics",
    "TrainingObserver",
    "bottleneck_phase",
    "phase_shares",
    "start_exporter",
]
