import pytest
import typer
from typer.testing import CliRunner

from globaldl import summary as run_summary
from globaldl.cli import report as report_cli
from globaldl.monitoring.report import RankTotals, RunData, device_bottlenecks

PHASE_SECONDS = {
    "data_load": 1.5,
    "compute": 4.0,
    "compress": 0.5,
    "exchange": 6.0,
    "decompress": 0.5,
    "apply": 0.5,
}


def root_app() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(report_cli.app, name="report")
    return app


def invoke(*arguments: str):
    return CliRunner().invoke(root_app(), ["report", *arguments])


def a_summary() -> dict:
    """A run summary as `globaldl train --summary` writes it (validated against the schema)."""
    document = {
        "schema_version": run_summary.SCHEMA_VERSION,
        "run_id": "r-summary",
        "model": "lenet",
        "dataset": "mnist",
        "ranks": 2,
        "epochs": 2,
        "steps": 100,
        "skipped_steps": 1,
        "global_batch_size": 64,
        "learning_rate": 0.1,
        "val_accuracy": 0.91,
        "val_loss": 0.3,
        "history": [
            {
                "epoch": 1,
                "loss": 0.9,
                "accuracy": 0.7,
                "val_loss": 0.5,
                "val_accuracy": 0.85,
                "seconds": 6.0,
                "examples_per_second": 530.0,
            },
            {
                "epoch": 2,
                "loss": 0.4,
                "accuracy": 0.88,
                "val_loss": 0.3,
                "val_accuracy": 0.91,
                "seconds": 6.5,
                "examples_per_second": 510.0,
            },
        ],
        "wall_seconds": 14.0,
        "phase_seconds": PHASE_SECONDS,
        "gradient_bytes_raw": 100 * 246_824,
        "gradient_bytes_wire": 100 * 12_400,
        "compression_ratio": 246_824 / 12_400,
        "compression": {
            "prune": "topk",
            "density": 0.05,
            "quantize": "int8",
            "error_feedback": True,
        },
        "devices": ["edge-a"],
        "versions": {
            "tensorflow": "2.21.0",
            "horovod": "0.28.1",
            "globaldl": "0.1.0",
            "python": "3.11.7",
        },
    }
    run_summary.validate(document)
    return document


def test_report_from_a_summary_states_the_bottleneck_and_plots_what_it_can(tmp_path):
    path = tmp_path / "summary.json"
    run_summary.write(path, a_summary())
    result = invoke("--summary", str(path), "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.output
    sentence = (
        "On edge-a, the bottleneck is exchange: 46% of its own step time "
        "(60.0 ms of 130.0 ms per step)."
    )
    assert sentence in result.output
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert sentence in markdown
    assert "| edge-a | 15.0 | 40.0 | 5.0 | 60.0 | 5.0 | 5.0 | 0.0 | 130.0 |" in markdown
    assert "| edge-a | 24.68 | 1.24 | 19.91 |" in markdown
    pictures = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert pictures == [
        "gradient_bytes.png",
        "loss_accuracy.png",
        "step_time_by_phase.png",
        "stragglers.png",
        "throughput.png",
    ]
    assert (
        markdown.count("Not shown: needs Prometheus") == 2
    )  # over-time phases and device resources


def test_report_from_a_summary_with_local_steps_shows_who_each_round_waited_for(tmp_path):
    document = a_summary() | {"devices": ["edge-a", "edge-b"]}
    document["rounds"] = {
        "sync_every": "4",
        "overlap": True,
        "rounds": 3,
        "skipped_rounds": 0,
        "wire_bytes_per_sample": 10.0,
        "dense_fp32_bytes_per_sample": 100.0,
        "compute_utilisation": 0.5,
        # Rank 1 hands rounds 0 and 2 over last (0.3 s, 0.2 s after rank 0), rank 0 round 1.
        "rank_round_unix_seconds": [
            [[100.0, 102.0], [110.0, 112.0], [120.0, None]],
            [[100.3, 102.0], [109.9, 112.0], [120.2, 122.0]],
        ],
    }
    run_summary.validate(document)
    path = tmp_path / "summary.json"
    run_summary.write(path, document)
    result = invoke("--summary", str(path), "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "![Round hand-overs](round_handovers.png)" in markdown
    assert (tmp_path / "report" / "round_handovers.png").stat().st_size > 0
    assert "| 0 | edge-a | 3 | 1 | 0.0 | 100.0 |" in markdown
    assert "| 1 | edge-b | 3 | 2 | 200.0 | 300.0 |" in markdown


def test_a_report_without_round_times_says_what_would_show_them(tmp_path):
    path = tmp_path / "summary.json"
    run_summary.write(path, a_summary())
    assert invoke("--summary", str(path), "--out", str(tmp_path / "report")).exit_code == 0
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "Not shown: needs a run summary with local steps" in markdown
    assert not (tmp_path / "report" / "round_handovers.png").exists()


def test_device_bottleneck_counts_waiting_for_peers_apart_from_the_exchange():
    def rank(number, device, **seconds_per_step):
        phase_seconds = {phase: 10 * seconds_per_step.get(phase, 0.0) for phase in PHASE_SECONDS}
        return RankTotals(number, device, 10, 0, 320, phase_seconds, 0, 0)

    run = RunData(
        "r",
        "test",
        [
            # rank 0 has its batches early and waits in the exchange for rank 1's slow input
            rank(0, "edge-a", data_load=0.05, compute=0.04, exchange=0.20),
            rank(1, "edge-a", data_load=0.25, compute=0.04, exchange=0.01),
            # edge-b waits for edge-a too; its own work is compute
            rank(2, "edge-b", data_load=0.01, compute=0.03, exchange=0.26),
        ],
    )
    found = {
        b.device: (
            b.phase,
            round(b.share, 3),
            round(b.own_step_seconds, 3),
            round(b.peer_wait_seconds, 3),
        )
        for b in device_bottlenecks(run)
    }
    assert found == {
        "edge-a": ("data_load", 0.75, 0.2, 0.095),
        "edge-b": ("compute", 0.6, 0.05, 0.25),
    }
    assert device_bottlenecks(run)[0].sentence() == (
        "On edge-a, the bottleneck is data_load: 75% of its own step time "
        "(150.0 ms of 200.0 ms per step; it also waited 95.0 ms per step for slower peers)."
    )


def test_a_short_runs_first_step_does_not_make_the_exchange_its_bottleneck():
    """Both ranks wait seconds in their first step's exchange (tracing, Horovod's first
    negotiation); over 10 steps of slow input that would outweigh the input's 0.2 s a step."""
    first = dict.fromkeys(PHASE_SECONDS, 0.0) | {"exchange": 5.0}

    def rank(number, recorded_first):
        # 9 steady steps of 0.2 s waiting for input, plus the first step's 5 s exchange.
        phase_seconds = dict.fromkeys(PHASE_SECONDS, 0.0) | {"data_load": 1.8, "exchange": 5.0}
        phase_seconds["compute"] = 0.2
        return RankTotals(number, "edge-a", 10, 0, 320, phase_seconds, 0, 0, recorded_first)

    recorded = RunData("r", "test", [rank(0, first), rank(1, first)])
    [bottleneck] = device_bottlenecks(recorded)
    assert bottleneck.phase == "data_load"
    assert bottleneck.own_step_seconds == pytest.approx((1.8 + 0.2) / 9)
    assert recorded.ranks[0].step_seconds == pytest.approx((1.8 + 0.2) / 9)
    # Without the first step's phases (older exporters) the mean carries it.
    [unknown] = device_bottlenecks(RunData("r", "test", [rank(0, None), rank(1, None)]))
    assert unknown.phase == "exchange"


def test_report_needs_exactly_one_source(tmp_path):
    for arguments in (
        [],
        ["--summary", "s.json", "--prometheus", "http://127.0.0.1:1", "--run", "r"],
    ):
        result = invoke(*arguments, "--out", str(tmp_path))
        assert result.exit_code == 2
        assert "give either --prometheus URL --run RUN, or --summary FILE" in result.output
    result = invoke("--prometheus", "http://127.0.0.1:1", "--out", str(tmp_path))
    assert result.exit_code == 2 and "--prometheus needs --run RUN" in result.output


def test_report_says_when_prometheus_cannot_be_reached(tmp_path):
    with __import__("socket").socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = invoke(
        "--prometheus", f"http://127.0.0.1:{port}", "--run", "r1", "--out", str(tmp_path)
    )
    assert result.exit_code == 1
    assert f"cannot reach Prometheus at http://127.0.0.1:{port}" in result.output


def test_report_rejects_a_summary_that_breaks_the_schema(tmp_path):
    path = tmp_path / "summary.json"
    document = a_summary()
    del document["phase_seconds"]
    path.write_text(__import__("json").dumps(document))
    result = invoke("--summary", str(path), "--out", str(tmp_path / "report"))
    assert result.exit_code == 2
    assert "phase_seconds" in result.output
