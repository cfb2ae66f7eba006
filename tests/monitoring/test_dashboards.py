import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from globaldl.cli import dashboards as dashboards_cli
from globaldl.monitoring.dashboards import (
    DASHBOARDS_DIR,
    build_dashboards,
    expand_query,
    iter_panels,
    panel_queries,
    render_dashboard,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MODELS = build_dashboards()
MODEL = MODELS["globaldl-training"]
PANELS = [panel for panel in iter_panels(MODEL) if panel["type"] != "row"]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def root_app() -> typer.Typer:
    """The sub-command as globaldl/cli/main.py registers it."""
    app = typer.Typer()
    app.add_typer(dashboards_cli.app, name="dashboards")
    return app


def test_panel_ids_are_unique():
    ids = [panel["id"] for panel in iter_panels(MODEL)]
    assert len(ids) == len(set(ids))


def test_every_panel_has_a_unit_a_description_and_the_templated_datasource():
    for panel in PANELS:
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert len(panel.get("description", "")) > 30, panel["title"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_datasource_is_a_template_variable():
    variables = {variable["name"]: variable for variable in MODEL["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["run"]["datasource"] == DATASOURCE
    assert variables["device"]["includeAll"] and variables["device"]["allValue"] == ".+"


def test_every_rate_uses_rate_interval_and_every_query_selects_the_run():
    queries = panel_queries(MODEL)
    assert len(queries) >= 20
    for query in queries:
        windows = re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]*)\]", query.expr)
        assert all(window == "$__rate_interval" for window in windows), (
            query.panel_title,
            query.expr,
        )
        assert query.expr.count("rate(") == len(windows), query.expr
        assert 'run="$run"' in query.expr, (query.panel_title, query.expr)


def test_panels_fit_the_grid_without_overlapping():
    cells: set[tuple[int, int]] = set()
    for panel in iter_panels(MODEL):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered


def test_the_required_views_are_there():
    by_title = {panel["title"]: panel for panel in PANELS}
    step = by_title["Step time by phase — $device"]
    assert step["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert step["repeat"] == "device"
    assert (
        "globaldl:bottleneck_share:ratio" in by_title["Bottleneck per device"]["targets"][0]["expr"]
    )
    raw_wire = by_title["Gradient bytes: raw vs wire"]["targets"][0]
    assert (
        "globaldl_gradient_bytes_total" in raw_wire["expr"]
        and raw_wire["legendFormat"] == "{{kind}}"
    )
    expected = {
        "Compression ratio": "globaldl_gradient_bytes_total",
        "Throughput": "globaldl_examples_total",
        "Loss": "globaldl_loss",
        "Validation accuracy": "globaldl_validation_accuracy_ratio",
        "CPU utilisation": "globaldl_device_cpu_utilization_ratio",
        "Memory": "globaldl_device_memory_used_bytes",
        "Network": "globaldl_device_network_transmit_bytes_total",
        "Input I/O": "globaldl_device_disk_read_bytes_total",
        "Spread across ranks": "globaldl_step_seconds_sum",
        "Local work per step per rank": 'phase!="exchange"',
    }
    for title, metric in expected.items():
        assert any(metric in target["expr"] for target in by_title[title]["targets"]), title


def test_committed_dashboard_json_is_what_build_writes(tmp_path):
    for stem, model in MODELS.items():
        committed = DASHBOARDS_DIR / f"{stem}.json"
        assert committed.read_text() == render_dashboard(model), (
            f"{committed} is stale: run `globaldl dashboards build`"
        )
    result = CliRunner().invoke(root_app(), ["dashboards", "build", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{stem}.json" for stem in MODELS)
    assert json.loads((tmp_path / "globaldl-training.json").read_text()) == MODEL


def test_expand_query_substitutes_grafana_variables():
    expr = 'rate(x{run="$run", device=~"${device}"}[$__rate_interval])'
    assert expand_query(expr, run="r1", device="edge-a", rate_interval="30s") == (
        'rate(x{run="r1", device=~"edge-a"}[30s])'
    )
    with pytest.raises(ValueError, match=r"query uses \$cluster; known variables"):
        expand_query('up{cluster="$cluster"}', run="r1")


class _StandInGrafana(BaseHTTPRequestHandler):
    """Records what a Grafana would receive: no Grafana server can run here."""

    received: list[tuple[str, str, dict]] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append((self.path, self.headers.get("Authorization", ""), body))
        uid = body["dashboard"]["uid"]
        answer = json.dumps(
            {"id": 1, "uid": uid, "url": f"/d/{uid}/globaldl", "status": "success", "version": 1}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format, *args):  # noqa: A002
        pass


@pytest.fixture()
def stand_in_grafana():
    _StandInGrafana.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandInGrafana)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_push_sends_every_dashboard_through_grafana_client(stand_in_grafana, monkeypatch):
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_test_token")
    result = CliRunner().invoke(
        root_app(), ["dashboards", "push", "--url", stand_in_grafana, "--folder-uid", "fleet"]
    )
    assert result.exit_code == 0, result.output
    assert f"pushed {stand_in_grafana}/d/globaldl-training/globaldl" in result.output
    [(path, authorization, body)] = _StandInGrafana.received
    assert path == "/api/dashboards/db"
    assert authorization == "Bearer glsa_test_token"
    assert body["overwrite"] is True and body["folderUid"] == "fleet"
    assert body["dashboard"]["id"] is None
    assert body["dashboard"]["panels"] == MODEL["panels"]


def test_push_without_credentials_fails_with_a_clear_message(monkeypatch):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    result = CliRunner().invoke(root_app(), ["dashboards", "push", "--url", "http://127.0.0.1:1"])
    assert result.exit_code == 2
    assert "set $GRAFANA_TOKEN" in result.output


def test_grafana_provisioning_matches_the_compose_mounts():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert set(compose["services"]) == {"prometheus", "grafana", "node-exporter"}
    for name, service in compose["services"].items():
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", service["image"]), (
            f"{name} image is not pinned"
        )
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"
    grafana_mounts = dict(
        v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"] if v.startswith("./")
    )
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/globaldl.yaml").read_text()
    )
    assert grafana_mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    datasource = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    [source] = datasource["datasources"]
    assert source["type"] == "prometheus"
    listen = next(
        a
        for a in compose["services"]["prometheus"]["command"]
        if a.startswith("--web.listen-address=")
    )
    assert source["url"] == "http://" + listen.split("=", 1)[1]
