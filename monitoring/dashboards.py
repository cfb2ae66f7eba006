"""Grafana dashboards as code (grafana-foundation-sdk), their PromQL, and the push to Grafana."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus as prometheus_builders
from grafana_foundation_sdk.builders import stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models import prometheus as prometheus_models

from globaldl.files import write_text_atomically

DASHBOARDS_DIR = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "dashboards"
"""deploy/grafana/dashboards/: the generated JSON, committed and provisioned into Grafana."""

DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")
"""Every panel and query reads from the dashboard's `datasource` template variable."""

SELECTOR = 'run="$run", device=~"$device"'
"""Label matchers every panel query starts with: the chosen run and devices."""


def _selector(extra: str = "") -> str:
    return "{" + SELECTOR + (f", {extra}" if extra else "") + "}"


def _rate(metric: str, extra: str = "") -> str:
    """rate() of `metric` for the chosen run and devices over Grafana's $__rate_interval."""
    return f"rate({metric}{_selector(extra)}[$__rate_interval])"


_NOT_EXCHANGE = 'phase!="exchange"'
_RAW = 'kind="raw"'
_WIRE = 'kind="wire"'

_EXCHANGE = 'phase="exchange"'
# Per-rank mean seconds per step in the exchange (waiting for peers included).
_EXCHANGE_PER_RANK = (
    f"(sum by (device, rank) ({_rate('globaldl_step_phase_seconds_sum', _EXCHANGE)})\n"
    f"  / sum by (device, rank) ({_rate('globaldl_step_phase_seconds_count', _EXCHANGE)}))"
)
# Per-rank mean seconds per step, and seconds per step spent outside the exchange.
_STEP_SECONDS_PER_RANK = (
    f"sum by (device, rank) ({_rate('globaldl_step_seconds_sum')})\n"
    f"  / sum by (device, rank) ({_rate('globaldl_step_seconds_count')})"
)
_LOCAL_SECONDS_PER_RANK = (
    f"sum by (device, rank) ({_rate('globaldl_step_phase_seconds_sum', _NOT_EXCHANGE)})\n"
    f"  / sum by (device, rank) ({_rate('globaldl_step_seconds_count')})"
)


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str


def _target(query: Query, ref_id: str, *, instant: bool = False) -> prometheus_builders.Dataquery:
    target = (
        prometheus_builders.Dataquery()
        .expr(query.expr)
        .legend_format(query.legend)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
    )
    if instant:
        target = target.instant().format(prometheus_models.PromQueryFormat.TABLE)
    return target


def _with_targets(panel: Any, queries: list[Query], *, instant: bool = False) -> Any:
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, chr(ord("A") + index), instant=instant))
    return panel


def _timeseries(
    panel_id: int,
    title: str,
    description: str,
    unit: str,
    queries: list[Query],
    *,
    stacked: bool = False,
    repeat_by_device: bool = False,
    width: int = 12,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .min(0)
        .fill_opacity(40 if stacked else 10)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common_models.LegendDisplayMode.TABLE)
            .placement(common_models.LegendPlacement.BOTTOM)
            .calcs(["mean", "lastNotNull"])
        )
    )
    if stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common_models.StackingMode.NORMAL)
        )
    if repeat_by_device:
        panel = panel.repeat("device").repeat_direction("h").max_per_row(2)
    return _with_targets(panel, queries)


def _table(
    panel_id: int, title: str, description: str, unit: str, queries: list[Query]
) -> table.Panel:
    panel = (
        table.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
    )
    return _with_targets(panel, queries, instant=True)


def _stat(
    panel_id: int, title: str, description: str, unit: str, queries: list[Query]
) -> stat.Panel:
    panel = (
        stat.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(6)
        .height(8)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
    )
    return _with_targets(panel, queries)


def _row(panel_id: int, title: str) -> dashboard_builders.Row:
    return dashboard_builders.Row(title).id(panel_id)


def _variables() -> list[Any]:
    datasource = (
        dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus")
    )
    run = (
        dashboard_builders.QueryVariable("run")
        .label("Run")
        .datasource(DATASOURCE)
        .query("label_values(globaldl_steps_total, run)")
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_models.VariableSort.ALPHABETICAL_DESC)
    )
    device = (
        dashboard_builders.QueryVariable("device")
        .label("Device")
        .datasource(DATASOURCE)
        .query('label_values(globaldl_steps_total{run="$run"}, device)')
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_models.VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".+")
    )
    return [datasource, run, device]


def training_dashboard() -> dashboard_builders.Dashboard:
    """The globaldl training dashboard: where step time goes, per device, and why."""
    builder = (
        dashboard_builders.Dashboard("globaldl — training")
        .uid("globaldl-training")
        .description("Where the step time of a globaldl run goes, device by device.")
        .tags(["globaldl"])
        .refresh("10s")
        .time("now-30m", "now")
        .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
        .variables(_variables())
    )
    builder = builder.with_row(_row(100, "Where the step time goes"))
    builder = builder.with_panel(
        _timeseries(
            1,
            "Step time by phase — $device",
            "Mean seconds per step each phase takes on this device (averaged over its ranks), "
            "stacked: "
            "the stack's height is the step time. One panel per selected device.",
            "s",
            [
                Query(
                    f"sum by (phase) ({_rate('globaldl_step_phase_seconds_sum')})\n"
                    f"  / ignoring (phase) group_left ()\n"
                    f"sum ({_rate('globaldl_steps_total')})",
                    "{{phase}}",
                )
            ],
            stacked=True,
            repeat_by_device=True,
            width=24,
        )
    )
    builder = builder.with_panel(
        _timeseries(
            2,
            "Share of step time by phase",
            "Each phase's share of the device's measured step time over the last minute "
            "(recording rule globaldl:phase_share:ratio); the shares of a device add up to 100%. "
            "The exchange includes waiting for slower peers.",
            "percentunit",
            [Query(f"globaldl:phase_share:ratio{{{SELECTOR}}}", "{{device}} {{phase}}")],
        )
    )
    builder = builder.with_panel(
        _table(
            3,
            "Bottleneck per device",
            "The bottleneck of each device: the phase with the largest share of its own step "
            "time, the exchange counting only its transfer time, not waiting for slower peers "
            "(recording rule globaldl:bottleneck_share:ratio, the same rule as the report's).",
            "percentunit",
            [Query(f"globaldl:bottleneck_share:ratio{{{SELECTOR}}}", "{{device}}: {{phase}}")],
        )
    )
    builder = builder.with_row(_row(101, "Gradient exchange"))
    builder = builder.with_panel(
        _timeseries(
            4,
            "Gradient bytes: raw vs wire",
            "Bytes per second of gradients: raw = what dense fp32 gradients would take, wire = "
            "what the compressed payload handed to the exchange took. The gap is what compression "
            "saves.",
            "Bps",
            [Query(f"sum by (kind) ({_rate('globaldl_gradient_bytes_total')})", "{{kind}}")],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            5,
            "Compression ratio",
            "Raw gradient bytes over bytes on the wire, per device (10× = one tenth of the bytes "
            "sent).",
            "suffix:×",
            [
                Query(
                    f"sum by (device) ({_rate('globaldl_gradient_bytes_total', _RAW)})\n"
                    f"  / sum by (device) ({_rate('globaldl_gradient_bytes_total', _WIRE)})",
                    "{{device}}",
                )
            ],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            18,
            "Exchange: transfer and waiting for peers",
            "Seconds per step in the exchange. Transfer: the least exchange time of any rank "
            "(the last rank to arrive waits for nobody). Per rank: the rest of its exchange time, "
            "spent waiting for slower peers; a straggler makes every other rank wait.",
            "s",
            [
                Query(f"min ({_EXCHANGE_PER_RANK})", "transfer"),
                Query(
                    f"{_EXCHANGE_PER_RANK}\n  - on () group_left ()\nmin ({_EXCHANGE_PER_RANK})",
                    "{{device}} rank {{rank}} waiting",
                ),
            ],
            width=24,
        )
    )
    builder = builder.with_row(_row(102, "Progress"))
    builder = builder.with_panel(
        _timeseries(
            6,
            "Throughput",
            "Training examples per second, per device and for the whole fleet.",
            "suffix: examples/s",
            [
                Query(f"sum by (device) ({_rate('globaldl_examples_total')})", "{{device}}"),
                Query(f"sum ({_rate('globaldl_examples_total')})", "fleet"),
            ],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            7,
            "Steps and skipped steps",
            "Training steps per second per device, and steps whose update was skipped because some "
            "rank's gradients were not finite.",
            "suffix: steps/s",
            [
                Query(f"sum by (device) ({_rate('globaldl_steps_total')})", "{{device}} steps"),
                Query(
                    f"sum by (device) ({_rate('globaldl_skipped_steps_total')})",
                    "{{device}} skipped",
                ),
            ],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            8,
            "Loss",
            "Training loss of the latest step on each rank, and validation loss after each epoch.",
            "none",
            [
                Query(f"globaldl_loss{{{SELECTOR}}}", "train {{device}} rank {{rank}}"),
                Query(
                    f"max by (device) (globaldl_validation_loss{{{SELECTOR}}})",
                    "validation {{device}}",
                ),
            ],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            9,
            "Validation accuracy",
            "Validation accuracy after the latest epoch.",
            "percentunit",
            [
                Query(
                    f"max by (device) (globaldl_validation_accuracy_ratio{{{SELECTOR}}})",
                    "{{device}}",
                )
            ],
            width=6,
        )
    )
    builder = builder.with_panel(
        _stat(
            10,
            "Epoch",
            "The last epoch every selected rank has completed.",
            "none",
            [Query(f"min (globaldl_epoch{{{SELECTOR}}})", "epoch")],
        )
    )
    builder = builder.with_row(_row(103, "Device resources"))
    builder = builder.with_panel(
        _timeseries(
            11,
            "CPU utilisation",
            "Busy share of each device's CPUs (all processes), and the CPU cores its globaldl "
            "workers use.",
            "percentunit",
            [
                Query(
                    f"max by (device) (globaldl_device_cpu_utilization_ratio{{{SELECTOR}}})",
                    "{{device}} device",
                ),
                Query(
                    f"sum by (device) ({_rate('globaldl_process_cpu_seconds_total')})\n"
                    f"  / max by (device) (globaldl_device_cpus{{{SELECTOR}}})",
                    "{{device}} workers",
                ),
            ],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            12,
            "Memory",
            "Memory in use on each device, and the resident memory of its globaldl workers.",
            "bytes",
            [
                Query(
                    f"max by (device) (globaldl_device_memory_used_bytes{{{SELECTOR}}})",
                    "{{device}} used",
                ),
                Query(
                    f"sum by (device) (globaldl_process_resident_memory_bytes{{{SELECTOR}}})",
                    "{{device}} workers",
                ),
            ],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            13,
            "Network",
            "Bytes per second each device sends and receives on all interfaces (loopback included: "
            "ranks on one device exchange over it).",
            "Bps",
            [
                Query(
                    f"max by (device) ({_rate('globaldl_device_network_transmit_bytes_total')})",
                    "{{device}} sent",
                ),
                Query(
                    f"max by (device) ({_rate('globaldl_device_network_receive_bytes_total')})",
                    "{{device}} received",
                ),
            ],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            14,
            "Input I/O",
            "Bytes per second read from each device's disks, and read from storage by its globaldl "
            "workers (their input pipeline; page-cache hits are not counted).",
            "Bps",
            [
                Query(
                    f"max by (device) ({_rate('globaldl_device_disk_read_bytes_total')})",
                    "{{device}} disk",
                ),
                Query(
                    f"sum by (device) ({_rate('globaldl_process_disk_read_bytes_total')})",
                    "{{device}} workers",
                ),
            ],
        )
    )
    builder = builder.with_row(_row(104, "Stragglers"))
    builder = builder.with_panel(
        _timeseries(
            15,
            "Step time per rank",
            "Mean seconds per step on each rank. In synchronous training these stay close: fast "
            "ranks wait for the slowest in the exchange.",
            "s",
            [Query(_STEP_SECONDS_PER_RANK, "{{device}} rank {{rank}}")],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            16,
            "Local work per step per rank",
            "Mean seconds per step each rank works on its own (every phase but the exchange). The "
            "highest line is the straggler the others wait for.",
            "s",
            [Query(_LOCAL_SECONDS_PER_RANK, "{{device}} rank {{rank}}")],
        )
    )
    builder = builder.with_panel(
        _timeseries(
            17,
            "Spread across ranks",
            "Slowest minus fastest rank: mean step time and local work per step. A growing "
            "local-work "
            "spread means one device holds the fleet back.",
            "s",
            [
                Query(
                    f"max ({_STEP_SECONDS_PER_RANK})\n- min ({_STEP_SECONDS_PER_RANK})", "step time"
                ),
                Query(
                    f"max ({_LOCAL_SECONDS_PER_RANK})\n- min ({_LOCAL_SECONDS_PER_RANK})",
                    "local work",
                ),
            ],
            width=24,
        )
    )
    return builder


DASHBOARDS: dict[str, Callable[[], dashboard_builders.Dashboard]] = {
    "globaldl-training": training_dashboard,
}
"""Every dashboard by file stem; `globaldl dashboards build` writes STEM.json for each."""


def dashboard_json(builder: dashboard_builders.Dashboard) -> dict[str, Any]:
    """The Grafana JSON model of a dashboard, as plain dictionaries."""
    return json.loads(JSONEncoder().encode(builder.build()))


def build_dashboards() -> dict[str, dict[str, Any]]:
    """The JSON model of every dashboard, by file stem."""
    return {stem: dashboard_json(make()) for stem, make in DASHBOARDS.items()}


def render_dashboard(model: Mapping[str, Any]) -> str:
    """The JSON text written for a dashboard (stable key order, so diffs stay small)."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_dashboards(out_dir: Path = DASHBOARDS_DIR) -> list[Path]:
    """Write every dashboard to OUT_DIR/STEM.json atomically; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, model in build_dashboards().items():
        path = out_dir / f"{stem}.json"
        write_text_atomically(path, render_dashboard(model))
        paths.append(path)
    return paths


def iter_panels(model: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard model, those nested in collapsed rows included (rows too)."""
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


@dataclass(frozen=True)
class PanelQuery:
    """One PromQL expression of one panel, as the dashboard holds it (with $variables)."""

    panel_id: int
    panel_title: str
    ref_id: str
    expr: str


def panel_queries(model: Mapping[str, Any]) -> list[PanelQuery]:
    """Every PromQL expression of every panel of a dashboard model, in panel order."""
    return [
        PanelQuery(panel["id"], panel["title"], target["refId"], target["expr"])
        for panel in iter_panels(model)
        for target in panel.get("targets", [])
    ]


_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def expand_query(expr: str, *, run: str, device: str = ".+", rate_interval: str = "1m") -> str:
    """Substitute the dashboard's variables as Grafana would, to run `expr` on Prometheus directly.

    `device` is a regular expression (Grafana sends `.+` for "All"); `rate_interval` stands
    for $__rate_interval. Raises ValueError for any other variable.
    """
    values = {"run": run, "device": device, "__rate_interval": rate_interval}

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"query uses ${name}; known variables: {', '.join(sorted(values))}")
        return values[name]

    return _VARIABLE.sub(substitute, expr)


def push_dashboards(
    url: str,
    *,
    token: str | None = None,
    basic_auth: tuple[str, str] | None = None,
    folder_uid: str | None = None,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    timeout_seconds: float = 30.0,
) -> list[str]:
    """Create or overwrite every dashboard in the Grafana at `url`; return their URLs there.

    Authenticate with a service-account `token` or `basic_auth=(user, password)`.
    """
    from grafana_client import GrafanaApi

    if token is not None and basic_auth is not None:
        raise ValueError("give either a Grafana token or basic auth, not both")
    credential: str | tuple[str, str] | None = token if token is not None else basic_auth
    grafana = GrafanaApi.from_url(url, credential=credential, timeout=timeout_seconds)
    pushed = []
    for model in (models if models is not None else build_dashboards()).values():
        body: dict[str, Any] = {
            "dashboard": {**model, "id": None},
            "overwrite": True,
            "message": "globaldl dashboards push",
        }
        if folder_uid is not None:
            body["folderUid"] = folder_uid
        answer = grafana.dashboard.update_dashboard(body)
        pushed.append(f"{url.rstrip('/')}{answer.get('url', '')}")
    return pushed
