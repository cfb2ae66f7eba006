import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from globaldl.monitoring import PHASES, bottleneck_phase
from globaldl.monitoring.phases import own_seconds_per_step
from globaldl.monitoring.prometheus import CONFIG_DIR, render_config

RULE_FILES = sorted((CONFIG_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((CONFIG_DIR / "tests").glob("*.yml"))


def promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *arguments], capture_output=True, text=True, timeout=120)


def test_committed_config_passes_promtool_check_config():
    checked = promtool("check", "config", str(CONFIG_DIR / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_config_rendered_by_monitor_up_passes_promtool_check_config(tmp_path):
    path = render_config(tmp_path, scrape_interval_seconds=0.5)
    checked = promtool("check", "config", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = yaml.safe_load(path.read_text())
    assert config["global"]["scrape_interval"] == "500ms"
    assert [job["job_name"] for job in config["scrape_configs"]] == ["globaldl"]
    assert config["scrape_configs"][0]["file_sd_configs"][0]["files"] == [
        str((tmp_path / "targets" / "globaldl").resolve() / "*.json")
    ]


def test_rules_pass_promtool_check_rules():
    assert RULE_FILES
    checked = promtool("check", "rules", *map(str, RULE_FILES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 14 rules found" in checked.stdout


def test_rule_unit_tests_pass_promtool_test_rules():
    assert RULE_TESTS
    tested = promtool("test", "rules", *map(str, RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def _increment(values: str) -> float:
    """The per-interval increase of a promtool series like '0+5x20'."""
    match = re.fullmatch(r"0\+([0-9.]+)x\d+", values)
    assert match, values
    return float(match.group(1))


def test_python_bottleneck_rule_agrees_with_the_recording_rule_test():
    """The Python rule, fed the promtool test's input, names the phases the PromQL rule must."""
    suite = yaml.safe_load((CONFIG_DIR / "tests" / "globaldl.rules.test.yml").read_text())
    case = next(test for test in suite["tests"] if test["name"] == "bottleneck per device")
    increments: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for series in case["input_series"]:
        name = series["series"].split("{")[0]
        labels = dict(re.findall(r'(\w+)="([^"]*)"', series["series"]))
        key = (labels["device"], labels["rank"], labels["phase"])
        increments[key][name.rsplit("_", 1)[1]] = _increment(series["values"])
    per_step: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for (device, rank, phase), parts in increments.items():
        per_step[(device, rank)][phase] = parts["sum"] / parts["count"]
    own = own_seconds_per_step(per_step)
    devices = {device for device, _ in own}
    python_bottlenecks = {
        device: bottleneck_phase(
            {phase: sum(s[phase] for (d, _), s in own.items() if d == device) for phase in PHASES}
        )
        for device in devices
    }
    expected = next(
        check
        for check in case["promql_expr_test"]
        if "globaldl:bottleneck_share:ratio" in check["expr"] and check["exp_samples"]
    )
    promql_bottlenecks = {
        dict(re.findall(r'(\w+)="([^"]*)"', sample["labels"]))["device"]: dict(
            re.findall(r'(\w+)="([^"]*)"', sample["labels"])
        )["phase"]
        for sample in expected["exp_samples"]
    }
    assert python_bottlenecks == promql_bottlenecks == {"edge-a": "data_load", "edge-b": "compute"}
    # Without taking the waiting out of the exchange, edge-a would be blamed on the network.
    measured_edge_a = {
        phase: sum(s[phase] for (d, _), s in per_step.items() if d == "edge-a") for phase in PHASES
    }
    assert bottleneck_phase(measured_edge_a) == "exchange"


@pytest.mark.parametrize(
    "alert", ["GlobaldlFleetBoundByExchange", "GlobaldlStragglerDevice", "GlobaldlTrainingStalled"]
)
def test_every_alert_has_a_firing_case_in_the_rule_tests(alert):
    suite = yaml.safe_load((CONFIG_DIR / "tests" / "globaldl.rules.test.yml").read_text())
    firing = [
        check
        for test in suite["tests"]
        for check in test.get("alert_rule_test", [])
        if check["alertname"] == alert and check["exp_alerts"]
    ]
    quiet = [
        check
        for test in suite["tests"]
        for check in test.get("alert_rule_test", [])
        if check["alertname"] == alert and not check["exp_alerts"]
    ]
    assert firing and quiet, f"{alert} needs a case where it fires and one where it must not"


def test_config_dir_is_the_checkout_deploy_dir():
    assert CONFIG_DIR == Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
