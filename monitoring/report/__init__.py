"""A run report for people without Grafana: markdown and PNG plots, from Prometheus or a summary.

`data` holds what a report shows, `sources` reads it from a run summary or from Prometheus,
`plots` draws it and `markdown` writes the report.
"""

from globaldl.monitoring.report.data import (
    DeviceBottleneck,
    DeviceProfile,
    EpochPoint,
    RankHandovers,
    RankTotals,
    RunData,
    device_bottlenecks,
    device_profiles,
    rank_handovers,
    round_lateness,
)
from globaldl.monitoring.report.markdown import write_report
from globaldl.monitoring.report.sources import load_from_prometheus, load_from_summary

__all__ = [
    "DeviceBottleneck",
    "DeviceProfile",
    "EpochPoint",
    "RankHandovers",
    "RankTotals",
    "RunData",
    "device_bottlenecks",
    "device_profiles",
    "load_from_prometheus",
    "load_from_summary",
    "rank_handovers",
    "round_lateness",
    "write_report",
]
