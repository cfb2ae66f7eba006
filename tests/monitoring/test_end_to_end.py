"""End to end: a real Prometheus scrapes real `horovodrun -np 2 ... globaldl train` runs.

Every dashboard panel's PromQL must return data over a LeNet/MNIST run, and the bottleneck rule
(recording rule and report alike) must name the phase a run was built to be limited by: a
deliberately slowed input pipeline comes out as data_load, a heavy model with a tiny batch as
compute.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from monitoring_support import free_port, free_port_pair, horovod_launch

from globaldl.monitoring.dashboards import build_dashboards, expand_query, panel_queries
from globaldl.monitoring.discovery import remove_targets, write_targets
from globaldl.monitoring.prometheus import start_prometheus, stop_prometheus, targets_dir
from globaldl.monitoring.promql import PrometheusApi
from globaldl.monitoring.report import device_bottlenecks, load_from_prometheus, write_report

pytestmark = [pytest.mark.horovod, pytest.mark.slow]

DEVICE = "e2e-host"
# Rank 1 sleeps this long per batch in the input pipeline (LeNet's step work is ~20 ms here);
# rank 0, prefetched ahead, waits for it in the exchange. With both ranks slowed, which one runs
# behind changes during the run and the rule's exchange keeps part of the waiting (see
# phases.own_seconds_per_step), so the verdict could fall either way.
INPUT_DELAY_MS = 250
SLOW_INPUT_RANK = 1


@dataclass
class Run:
    run_id: str
    start_seconds: float
    last_step_seconds: float


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("prometheus")
    try:
        status = start_prometheus(state_dir, port=free_port(), scrape_interval_seconds=1.0)
        yield PrometheusApi(status.url), state_dir
    finally:
        stop_prometheus(state_dir)


def train(prometheus, tmp_path: Path, worker_env, run_id: str, arguments: list[str]) -> Run:
    """One 2-rank run whose workers Prometheus discovers through write_targets."""
    api, state_dir = prometheus
    base_port = free_port_pair()
    write_targets(
        targets_dir(state_dir), run_id=run_id, hosts=[("127.0.0.1", 2)], base_port=base_port
    )
    try:
        summary, _ = horovod_launch().horovod_train(
            tmp_path,
            [*arguments, "--metrics-port", str(base_port), "--run-id", run_id, "--device", DEVICE],
            worker_env,
        )
    finally:
        remove_targets(targets_dir(state_dir), run_id)
    assert summary["run_id"] == run_id
    [last_step] = api.query(
        f'max(max_over_time(globaldl_last_step_timestamp_seconds{{run="{run_id}"}}[15m]))'
    )
    [start] = api.query(
        f'min(min_over_time(globaldl_run_start_time_seconds{{run="{run_id}"}}[15m]))'
    )
    steps = api.query(f'max_over_time(globaldl_steps_total{{run="{run_id}"}}[15m])')
    assert sorted(s.labels["rank"] for s in steps) == ["0", "1"]
    assert all(s.value == summary["steps"] for s in steps), (steps, summary["steps"])
    return Run(run_id, start.value, last_step.value)


@pytest.fixture(scope="module")
def slow_input_run(prometheus, tmp_path_factory, venv_bin, worker_env):
    return train(
        prometheus,
        tmp_path_factory.mktemp("lenet"),
        worker_env,
        "e2e-lenet-slow-input",
        [
            "--model",
            "lenet",
            "--dataset",
            "mnist",
            "--epochs",
            "2",
            "--max-steps-per-epoch",
            "30",
            "--input-delay-ms",
            str(INPUT_DELAY_MS),
            "--input-delay-rank",
            str(SLOW_INPUT_RANK),
        ],
    )


@pytest.mark.parametrize(
    "query",
    panel_queries(build_dashboards()["globaldl-training"]),
    ids=lambda q: f"{q.panel_id}{q.ref_id}",
)
def test_every_dashboard_panel_returns_data_over_a_real_run(prometheus, slow_input_run, query):
    api, _ = prometheus
    expr = expand_query(query.expr, run=slow_input_run.run_id, device=DEVICE, rate_interval="10s")
    series = api.query_range(
        expr, slow_input_run.start_seconds, slow_input_run.last_step_seconds + 30, 1.0
    )
    values = [value for one in series for value in one.values if not math.isnan(value)]
    assert values, (
        f"panel {query.panel_title!r} {query.ref_id} returned nothing over the run:\n{expr}"
    )


def test_slow_input_pipeline_comes_out_as_data_load(prometheus, slow_input_run, tmp_path):
    api, _ = prometheus
    [recorded] = api.query(
        f'globaldl:bottleneck_share:ratio{{run="{slow_input_run.run_id}"}}',
        time_seconds=slow_input_run.last_step_seconds,
    )
    assert recorded.labels["phase"] == "data_load", recorded
    data = load_from_prometheus(api, slow_input_run.run_id)
    [bottleneck] = device_bottlenecks(data)
    assert (bottleneck.device, bottleneck.phase) == (DEVICE, "data_load")
    # The rank whose pipeline runs behind waits about the whole delay for each batch (the
    # other, prefetched ahead, waits for it in the exchange instead).
    slowest_data_load = max(rank.phase_seconds["data_load"] / rank.steps for rank in data.ranks)
    assert slowest_data_load >= 0.5 * INPUT_DELAY_MS / 1000
    # The other rank's input has no delay: its batches wait in the prefetch buffer.
    fastest_data_load = min(rank.phase_seconds["data_load"] / rank.steps for rank in data.ranks)
    assert fastest_data_load < 0.1 * INPUT_DELAY_MS / 1000
    report = write_report(data, tmp_path).read_text()
    assert f"On {DEVICE}, the bottleneck is data_load:" in report


def test_heavy_model_with_a_tiny_batch_comes_out_as_compute(
    prometheus, tmp_path, venv_bin, worker_env
):
    api, _ = prometheus
    run = train(
        prometheus,
        tmp_path,
        worker_env,
        "e2e-resnet-tiny-batch",
        [
            "--model",
            "resnet",
            "--depth",
            "20",
            "--dataset",
            "cifar-synthetic",
            "--batch-size",
            "2",
            "--epochs",
            "1",
            "--max-steps-per-epoch",
            "40",
        ],
    )
    # The rule's latest evaluation over the run's scrapes: a short run on a loaded machine
    # may end between two evaluations, so look back instead of at one instant.
    # Each sample's time: the newest series is the rule's verdict at the end of the run.
    stamped = api.query(
        f'timestamp(last_over_time(globaldl:bottleneck_share:ratio{{run="{run.run_id}"}}[5m]))'
    )
    recorded = max(stamped, key=lambda sample: sample.value)
    assert recorded.labels["phase"] == "compute", stamped
    [bottleneck] = device_bottlenecks(load_from_prometheus(api, run.run_id))
    assert (bottleneck.device, bottleneck.phase) == (DEVICE, "compute")
