"""Where a run report's data comes from: a run summary, or the run's metrics in Prometheus."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from globaldl.monitoring.metrics import check_run_id
from globaldl.monitoring.phases import PHASES, check_phase_seconds
from globaldl.monitoring.promql import PrometheusApi
from globaldl.monitoring.report.data import EpochPoint, RankTotals, RunData

DEFAULT_LOOKBACK_SECONDS = 24 * 3600.0
"""How far back `load_from_prometheus` looks for the run."""
RANGE_POINTS = 200
"""About this many points per plotted time series."""
MIN_RATE_WINDOW_SECONDS = 20.0
"""The shortest rate() window of the plotted rates: several scrapes at a 5 s interval."""

_NOT_EXCHANGE = 'phase!="exchange"'


def load_from_summary(path: Path) -> RunData:
    """A report's data from a run summary (rank 0's view; no time series, no resources)."""
    from globaldl import summary as run_summary

    document = run_summary.read(Path(path))
    ranks = max(int(document["ranks"]), 1)
    device = (document.get("devices") or ["rank 0"])[0]
    own_totals = (document.get("rank_totals") or [{}])[0]
    first_step = own_totals.get("first_step_phase_seconds")
    rank0 = RankTotals(
        rank=0,
        device=device,
        steps=float(document["steps"]),
        skipped_steps=float(document.get("skipped_steps", 0)),
        examples=float(document["steps"]) * document["global_batch_size"] / ranks,
        phase_seconds=check_phase_seconds(document["phase_seconds"]),
        gradient_bytes_raw=float(document["gradient_bytes_raw"]),
        gradient_bytes_wire=float(document["gradient_bytes_wire"]),
        first_step_phase_seconds=check_phase_seconds(first_step) if first_step else None,
    )
    epochs = [
        EpochPoint(
            int(entry["epoch"]),
            float(entry["loss"]),
            float(entry["val_loss"]),
            float(entry["val_accuracy"]),
            float(entry.get("examples_per_second", math.nan)),
        )
        for entry in document.get("history", [])
    ]
    source = (
        f"run summary {path} (rank 0 of {ranks}; {document['model']} on {document['dataset']}, "
        f"{document['wall_seconds']:.1f} s; with one rank, its exchange includes any waiting "
        "for peers)"
    )
    per_rank = (document.get("rounds") or {}).get("rank_round_unix_seconds") or []
    handovers = [[float(handed) for handed, _ in rank] for rank in per_rank]
    return RunData(
        document["run_id"],
        source,
        [rank0],
        epochs,
        round_handovers=handovers,
        rank_devices=[str(name) for name in document.get("devices") or []],
    )


def _by_labels(samples: list[Any], *names: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sample.labels.get(name, "") for name in names): sample.value for sample in samples
    }


def _run_time_range(api: PrometheusApi, run: str, lookback_seconds: float) -> tuple[float, float]:
    """(first worker start, latest step) of `run` as Unix seconds, from raw samples."""
    selector = f'{{run="{run}"}}'
    lookback = f"{int(lookback_seconds)}s"
    starts = api.query(f"min(min_over_time(globaldl_run_start_time_seconds{selector}[{lookback}]))")
    ends = api.query(
        f"max(max_over_time(globaldl_last_step_timestamp_seconds{selector}[{lookback}]))"
    )
    if not starts or not ends or not all(math.isfinite(s.value) for s in starts + ends):
        seen = api.query(f"count by (run) (last_over_time(globaldl_steps_total[{lookback}]))")
        runs = sorted(sample.labels.get("run", "") for sample in seen)
        raise ValueError(
            f"Prometheus at {api.url} has no steps of run {run!r} in the last {lookback}; "
            f"runs it has: {', '.join(runs) or 'none'}"
        )
    return starts[0].value, max(ends[0].value, starts[0].value + 1.0)


def load_from_prometheus(
    api: PrometheusApi, run: str, *, lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS
) -> RunData:
    """A report's data for `run` from Prometheus: per-rank totals and each view's time series."""
    check_run_id(run)
    start, end = _run_time_range(api, run, lookback_seconds)
    selector = f'{{run="{run}"}}'
    # Every total is read at one instant, so steps and seconds come from the same scrapes: a
    # second past the latest sample of a live run, or a minute after a finished run's last
    # step (its final scrapes).
    evaluated_at = min(time.time() - 1.0, end + 60.0)
    whole_run = f"{int(evaluated_at - start) + 60}s"

    def last(metric: str, *names: str) -> dict[tuple[str, ...], float]:
        expr = f"last_over_time({metric}{selector}[{whole_run}])"
        return _by_labels(api.query(expr, time_seconds=evaluated_at), *names)

    phase_seconds = last("globaldl_step_phase_seconds_sum", "device", "rank", "phase")
    first_step = last("globaldl_first_step_phase_seconds", "device", "rank", "phase")
    steps = last("globaldl_steps_total", "device", "rank")
    skipped = last("globaldl_skipped_steps_total", "device", "rank")
    examples = last("globaldl_examples_total", "device", "rank")
    gradient_bytes = last("globaldl_gradient_bytes_total", "device", "rank", "kind")
    ranks = [
        RankTotals(
            rank=int(rank),
            device=device,
            steps=count,
            skipped_steps=skipped.get((device, rank), 0.0),
            examples=examples.get((device, rank), 0.0),
            phase_seconds={
                phase: phase_seconds.get((device, rank, phase), 0.0) for phase in PHASES
            },
            gradient_bytes_raw=gradient_bytes.get((device, rank, "raw"), 0.0),
            gradient_bytes_wire=gradient_bytes.get((device, rank, "wire"), 0.0),
            first_step_phase_seconds=(
                {phase: first_step.get((device, rank, phase), 0.0) for phase in PHASES}
                if any(key[:2] == (device, rank) for key in first_step)
                else None
            ),
        )
        for (device, rank), count in sorted(steps.items(), key=lambda item: int(item[0][1]))
    ]
    step_seconds = max((end - start) / RANGE_POINTS, 1.0)
    window = f"{int(max(2 * step_seconds, MIN_RATE_WINDOW_SECONDS))}s"

    def rate(metric: str, extra: str = "") -> str:
        matchers = f'run="{run}"' + (f", {extra}" if extra else "")
        return f"rate({metric}{{{matchers}}}[{window}])"

    queries = {
        "phase_seconds_per_step": (
            f"sum by (device, phase) ({rate('globaldl_step_phase_seconds_sum')})"
            f" / on (device) group_left () sum by (device) ({rate('globaldl_steps_total')})"
        ),
        "throughput": f"sum by (device) ({rate('globaldl_examples_total')})",
        "loss": f"globaldl_loss{selector}",
        "val_accuracy": f"max by (device) (globaldl_validation_accuracy_ratio{selector})",
        "cpu": f"max by (device) (globaldl_device_cpu_utilization_ratio{selector})",
        "memory": f"max by (device) (globaldl_device_memory_used_bytes{selector})",
        "network_transmit": (
            f"max by (device) ({rate('globaldl_device_network_transmit_bytes_total')})"
        ),
        "network_receive": (
            f"max by (device) ({rate('globaldl_device_network_receive_bytes_total')})"
        ),
        "disk_read": f"max by (device) ({rate('globaldl_device_disk_read_bytes_total')})",
        "local_step_seconds": (
            f"sum by (device, rank) ({rate('globaldl_step_phase_seconds_sum', _NOT_EXCHANGE)})"
            f" / sum by (device, rank) ({rate('globaldl_steps_total')})"
        ),
    }
    series = {
        name: api.query_range(expr, start, end, step_seconds) for name, expr in queries.items()
    }
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(start))
    source = f"Prometheus at {api.url}, {started} UTC + {end - start:.0f} s"
    return RunData(run, source, ranks, [], series)
