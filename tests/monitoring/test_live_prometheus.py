"""A real Prometheus, started by `globaldl monitor up`, scraping real exporters.

The exporters are fed by tests/monitoring/synthetic_worker.py, a stand-in for the trainer: each
is one process running start_exporter and calling observe_step with synthetic phase seconds in
which one known phase dominates (data_load on edge-a, compute on edge-b). The end-to-end test
with a real `horovodrun ... globaldl train --metrics-port` run comes next, once the trainer lands.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from monitoring_support import free_port_pair, start_synthetic_worker, stop_process, wait_for
from typer.testing import CliRunner

from globaldl.cli import monitor as monitor_cli
from globaldl.cli import report as report_cli
from globaldl.monitoring import bottleneck_phase
from globaldl.monitoring.dashboards import build_dashboards, expand_query, panel_queries
from globaldl.monitoring.phases import own_seconds_per_step
from globaldl.monitoring.prometheus import prometheus_status, stop_prometheus
from globaldl.monitoring.promql import PrometheusApi

RUN = "r-live"
DOMINANT = {"edge-a": "data_load", "edge-b": "compute"}


def root_app() -> typer.Typer:
    """The sub-commands as globaldl/cli/main.py registers them."""
    app = typer.Typer()
    app.add_typer(monitor_cli.app, name="monitor")
    app.add_typer(report_cli.app, name="report")
    return app


@dataclass
class Live:
    url: str
    state_dir: Path
    api: PrometheusApi
    pid: int


def invoke(*arguments: str):
    return CliRunner().invoke(root_app(), list(arguments))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("prometheus")
    prometheus_port = free_port_pair()
    workers = []
    try:
        started = invoke(
            "monitor",
            "up",
            "--state-dir",
            str(state_dir),
            "--port",
            str(prometheus_port),
            "--scrape-interval",
            "1",
            "--timeout",
            "30",
        )
        assert started.exit_code == 0, started.output
        assert f"Prometheus started at http://127.0.0.1:{prometheus_port}" in started.output
        base_port = free_port_pair()
        for rank, device in enumerate(DOMINANT):
            workers.append(
                start_synthetic_worker(
                    port=base_port + rank,
                    rank=rank,
                    device=device,
                    run=RUN,
                    dominant_phase=DOMINANT[device],
                )
            )
        targets = invoke(
            "monitor",
            "targets",
            "--run",
            RUN,
            "-H",
            "127.0.0.1:2",
            "--metrics-port",
            str(base_port),
            "--state-dir",
            str(state_dir),
        )
        assert targets.exit_code == 0, targets.output
        status = prometheus_status(state_dir)
        api = PrometheusApi(status.url)
        # Ready when both devices have a bottleneck (rules saw >= 2 scrapes) and validation ran.
        wait_for(
            lambda: (
                len(api.query(f'globaldl:bottleneck_share:ratio{{run="{RUN}"}}')) == 2
                and len(api.query(f'globaldl_validation_accuracy_ratio{{run="{RUN}"}}')) == 2
                # Enough scrapes that the report's rate() windows hold several samples, even
                # when a loaded machine delays some scrapes.
                and len(
                    api.query(f'count_over_time(globaldl_steps_total{{run="{RUN}"}}[1m]) >= 15')
                )
                == 2
            ),
            timeout_seconds=90,
            what="both devices' bottleneck and validation series",
        )
        yield Live(status.url, state_dir, api, status.pid)
    finally:
        for worker in workers:
            stop_process(worker)
        stop_prometheus(state_dir)


def test_monitor_up_is_idempotent(live):
    again = invoke("monitor", "up", "--state-dir", str(live.state_dir), "--port", "1")
    assert again.exit_code == 0, again.output
    assert f"Prometheus already running at {live.url} (pid {live.pid})" in again.output


def test_monitor_status_reports_the_server_and_its_targets(live):
    status = invoke("monitor", "status", "--state-dir", str(live.state_dir))
    assert status.exit_code == 0, status.output
    assert f"running at {live.url} (pid {live.pid}), ready; targets up 2, down 0" in status.output


def test_prometheus_scrapes_every_rank_with_its_labels(live):
    steps = live.api.query(f'globaldl_steps_total{{run="{RUN}"}}')
    assert {(s.labels["rank"], s.labels["device"], s.labels["job"]) for s in steps} == {
        ("0", "edge-a", "globaldl"),
        ("1", "edge-b", "globaldl"),
    }
    assert all(s.value > 10 for s in steps)
    up = live.api.query(f'up{{job="globaldl", run="{RUN}"}}')
    assert sorted((s.labels["rank"], s.value) for s in up) == [("0", 1.0), ("1", 1.0)]


def test_recording_rule_and_python_rule_name_the_same_bottleneck(live):
    measured = {}
    for sample in live.api.query(f'globaldl:phase_seconds_per_step:mean1m{{run="{RUN}"}}'):
        key = (sample.labels["device"], sample.labels["rank"])
        measured.setdefault(key, {})[sample.labels["phase"]] = sample.value
    assert {device for device, _ in measured} == set(DOMINANT)
    own = own_seconds_per_step(measured)
    python = {device: bottleneck_phase(seconds) for (device, _), seconds in own.items()}
    recorded = {
        s.labels["device"]: s.labels["phase"]
        for s in live.api.query(f'globaldl:bottleneck_share:ratio{{run="{RUN}"}}')
    }
    assert recorded == python == DOMINANT
    shares = live.api.query(f'globaldl:own_phase_share:ratio{{run="{RUN}"}}')
    for device in DOMINANT:
        assert math.isclose(
            sum(s.value for s in shares if s.labels["device"] == device), 1.0, rel_tol=1e-9
        )


@pytest.mark.parametrize(
    "query",
    panel_queries(build_dashboards()["globaldl-training"]),
    ids=lambda q: f"{q.panel_id}{q.ref_id}",
)
def test_every_dashboard_panel_query_returns_data(live, query):
    expr = expand_query(query.expr, run=RUN, device=".+", rate_interval="10s")
    result = live.api.query(expr)
    assert result, f"panel {query.panel_title!r} {query.ref_id} returned nothing:\n{expr}"
    assert any(not math.isnan(sample.value) for sample in result), expr


def test_repeated_panel_returns_data_for_each_device(live):
    [step_by_phase] = [
        q for q in panel_queries(build_dashboards()["globaldl-training"]) if q.panel_id == 1
    ]
    for device in DOMINANT:
        result = live.api.query(
            expand_query(step_by_phase.expr, run=RUN, device=device, rate_interval="30s")
        )
        seconds = {s.labels["phase"]: s.value for s in result}
        assert max(seconds, key=seconds.get) == DOMINANT[device]
        # The worker reports 0.040 s. A scrape reads one metric after another while steps go
        # on, so a window's ratio can be off by one step: 10% leaves room for that.
        assert seconds[DOMINANT[device]] == pytest.approx(0.040, rel=0.1)


def test_report_from_prometheus_states_each_devices_bottleneck(live, tmp_path):
    result = invoke("report", "--prometheus", live.url, "--run", RUN, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "report.md").read_text()
    for device, phase in DOMINANT.items():
        assert f"On {device}, the bottleneck is {phase}:" in markdown
        assert f"On {device}, the bottleneck is {phase}:" in result.output
    pictures = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pictures == sorted(
        [
            "step_time_by_phase.png",
            "step_time_over_time.png",
            "gradient_bytes.png",
            "throughput.png",
            "loss_accuracy.png",
            "resources.png",
            "stragglers.png",
        ]
    ), markdown
    for picture in pictures:
        assert f"]({picture})" in markdown
        data = (tmp_path / picture).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, picture
    # Only the round hand-overs are missing: every rank's round times are in run summaries.
    assert markdown.count("Not shown") == 1
    assert "Not shown: needs a run summary with local steps" in markdown


def test_report_for_an_unknown_run_names_the_runs_prometheus_has(live, tmp_path):
    result = invoke(
        "report", "--prometheus", live.url, "--run", "no-such-run", "--out", str(tmp_path)
    )
    assert result.exit_code == 2
    assert "no steps of run 'no-such-run'" in result.output and RUN in result.output


def test_monitor_down_stops_prometheus_and_is_safe_twice(live):
    first = invoke("monitor", "down", "--state-dir", str(live.state_dir))
    assert first.exit_code == 0 and "Prometheus stopped" in first.output, first.output
    assert (
        not Path(f"/proc/{live.pid}").exists()
        or "Z" in Path(f"/proc/{live.pid}/stat").read_text().split()[2]
    )
    second = invoke("monitor", "down", "--state-dir", str(live.state_dir))
    assert second.exit_code == 0 and "Prometheus was not running" in second.output, second.output
    status = invoke("monitor", "status", "--state-dir", str(live.state_dir))
    assert status.exit_code == 1 and "not running" in status.output
