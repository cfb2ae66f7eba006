"""The `scaling` experiment: its plan, and its three targets evaluated from run results."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from experiment_fakes import device_resources, result, summary

from globaldl.experiments import ScalingExperiment, write_outputs
from globaldl.experiments.scaling import CODECS, SUMMABLE, TRAFFIC


def test_scaling_plan_covers_every_mode_at_2_to_16_devices_and_the_sites() -> None:
    plan = ScalingExperiment().plan()
    flat = [spec for spec in plan if spec.fleet.sites is None]
    assert {spec.fleet.devices for spec in flat} == {2, 4, 8, 16}
    assert {spec.factors["codec"] for spec in flat} == set(CODECS)
    assert len(flat) == 4 * len(CODECS)
    assert all(spec.fleet.profile == "lte" and spec.fleet.cpu_cores_total <= 2.0 for spec in plan)
    sites = [spec for spec in plan if spec.fleet.sites is not None]
    assert {spec.fleet.sites for spec in sites} == {"4x4"}
    assert [(s.factors["codec"], s.factors["exchange"]) for s in sites] == [
        ("dense", "ring"),
        ("dense", "hierarchy"),
        ("shared-topk+intsum", "ring"),
        ("shared-topk+intsum", "hierarchy"),
    ]
    assert [s.option("--hierarchy") for s in sites] == [None, "sites", None, "sites"]
    assert {spec.option("--epochs") for spec in plan} == {"2"}  # fixed epochs, one repeat
    assert all(spec.scrape_metrics for spec in plan)  # the steady traffic comes from scrapes
    # Linear scaling up to 8 devices (0.08); 16 devices train at that cap, not at 0.16.
    rates = {spec.fleet.devices: spec.option("--learning-rate") for spec in plan}
    assert rates == {2: None, 4: None, 8: None, 16: "0.08"}


def _results(plan, tx_bytes, accuracy, step_seconds, scraped=None):
    """Fake results: steady interface bytes, accuracy and steady step chosen per run label.

    The whole run also carries a 2 MB broadcast and a 30 s first step (tracing): the targets
    must read the steady figures, not these. `scraped(spec)` devices are scraped (all).
    """
    results = []
    for spec in plan:
        devices = spec.fleet.devices if scraped is None else scraped(spec)
        run = result(
            spec,
            summary(
                epoch_seconds=[10.0, 10.0],
                val_accuracies=[0.8, accuracy(spec)],
                steps=10,
                phase_seconds={"exchange": 9 * step_seconds(spec) + 30.0},
            ),
            resources={
                f"d{index}": device_resources(
                    f"d{index}", cpu_seconds=1.0, memory_mb=500, sent_bytes=1e6
                )
                for index in range(devices)
            },
        )
        run.summary["rank_totals"] = [{"first_step_phase_seconds": {"exchange": 30.0}}]
        hierarchy = "sites" if spec.factors.get("exchange") == "hierarchy" else "none"
        run.summary["exchange"] = {
            "combine": "sum",
            "collectives_per_step": 1,
            "hierarchy": hierarchy,
        }
        run.summary["traffic"] = {"device_tx_bytes_per_step_model": 1.0}
        run.accounting["mean_tx_bytes"] = 10 * tx_bytes(spec) + 2_000_000
        run.resources = {
            name: dataclasses.replace(
                resources, steady_steps=8, steady_transmit_bytes=8 * tx_bytes(spec)
            )
            for name, resources in run.resources.items()
        }
        results.append(run)
    return results


def test_scaling_targets_are_met_by_flat_summed_traffic_and_a_faster_hierarchy(
    tmp_path: Path,
) -> None:
    experiment = ScalingExperiment()
    plan = experiment.plan()

    def tx_bytes(spec):  # dense grows with N; summable codecs stay flat at 1/100
        codec = spec.factors["codec"]
        return 500_000 if codec in ("dense", "fp16", "topk+int8") else 4_000 + spec.fleet.devices

    report = write_outputs(
        experiment,
        _results(
            plan,
            tx_bytes,
            lambda spec: 0.95,
            lambda spec: 1.0 if spec.factors["exchange"] == "hierarchy" else 3.0,
        ),
        tmp_path,
    )
    statuses = {check.goal: check.status for check in report.targets}
    assert len(statuses) == 2 * len(SUMMABLE) + 2
    assert set(statuses.values()) == {"met"}, statuses
    assert (tmp_path / "scaling.png").exists() and (tmp_path / "scaling.md").exists()
    row = next(r for r in report.rows if r["label"] == "shared-topk_intsum-n16")
    assert row["traffic_ratio_vs_dense"] == 500_000 / 4_016
    assert row[TRAFFIC] == 4_016 and row["device_tx_bytes_per_step"] == 4_016 + 200_000
    assert row["steady_step_seconds"] == 3.0
    assert row["beyond_model_tx_bytes_per_second"] == (4_016 - 1.0) / 3.0
    # Under the hierarchy the summary models a leader (5 payloads on 4x4); the steady bytes
    # average all 16 devices, which send 2.625 payloads on average.
    row = next(r for r in report.rows if r["label"] == "dense-sites4x4-hierarchy")
    assert row["beyond_model_tx_bytes_per_second"] == pytest.approx(500_000 - 2.625 / 5.0)


def test_scaling_traffic_is_unknown_unless_every_device_was_scraped(tmp_path: Path) -> None:
    experiment = ScalingExperiment()
    report = write_outputs(
        experiment,
        _results(
            experiment.plan(),
            lambda spec: 4_000,
            lambda spec: 0.95,
            lambda spec: 1.0,
            scraped=lambda spec: spec.fleet.devices - (spec.factors["codec"] in SUMMABLE),
        ),
        tmp_path,
    )
    rows = {row["label"]: row for row in report.rows}
    assert rows["dense-n4"][TRAFFIC] == 4_000
    assert rows["shared-topk_intsum-n4"][TRAFFIC] is None
    assert rows["shared-topk_intsum-n4"]["beyond_model_tx_bytes_per_second"] is None
    assert rows["dense-n4"]["beyond_model_tx_bytes_per_second"] == 4_000 - 1.0
    flat = [check for check in report.targets if "within" in check.goal and "x of" in check.goal]
    assert flat and all(c.measured == "missing runs" and c.met is None for c in flat)


def test_scaling_targets_are_not_met_when_bytes_grow_accuracy_drops_or_sites_do_not_help(
    tmp_path: Path,
) -> None:
    experiment = ScalingExperiment()
    report = write_outputs(
        experiment,
        _results(
            experiment.plan(),
            lambda spec: 1000 * spec.fleet.devices,  # grows with N: gathered, not summed
            lambda spec: 0.90 if spec.factors["codec"] in SUMMABLE else 0.95,
            lambda spec: 4.0 if spec.factors["exchange"] == "hierarchy" else 2.0,
        ),
        tmp_path,
    )
    assert {check.status for check in report.targets} == {"NOT met"}
    # A hierarchy slower than the ring reads as a speed-up below 1x, not as "2x".
    sites = [check for check in report.targets if "hierarchical" in check.goal]
    assert len(sites) == 2 and all(
        c.measured.startswith("0.500x (4.00 s vs 2.00 s") for c in sites
    ), sites


def test_a_report_rebuilds_scaling_from_its_recorded_options() -> None:
    """The results record `workload: lenet` (a name); the report keeps the Workload default
    rather than handing the constructor a string, and the rebuilt plan is the one run."""
    from globaldl.cli.experiment.report import recorded_options

    experiment = ScalingExperiment(epochs=3, device_counts=(2, 4))
    options = recorded_options("scaling", {"experiment": experiment.get_config()})
    assert "workload" not in options and options["epochs"] == 3
    rebuilt = ScalingExperiment(**options, device_counts=(2, 4))
    assert [spec.label for spec in rebuilt.plan()] == [spec.label for spec in experiment.plan()]
