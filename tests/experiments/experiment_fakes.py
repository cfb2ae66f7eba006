"""Run results built from given numbers, to test tables, plots and targets without a fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from globaldl.experiments.runner import RunResult
from globaldl.experiments.scrape import DeviceResources
from globaldl.experiments.spec import RunSpec
from globaldl.fleet.profiles import LinkProfile
from globaldl.monitoring import PHASES


def summary(
    *,
    epoch_seconds: list[float],
    val_accuracies: list[float],
    steps: int = 20,
    ranks: int = 2,
    phase_seconds: dict[str, float] | None = None,
    wire_bytes: int = 1000,
) -> dict[str, Any]:
    """A run summary with the fields the experiments read."""
    history = [
        {
            "epoch": index + 1,
            "loss": 1.0,
            "accuracy": accuracy,
            "val_loss": 1.0,
            "val_accuracy": accuracy,
            "seconds": seconds,
            "examples_per_second": 100.0,
        }
        for index, (seconds, accuracy) in enumerate(zip(epoch_seconds, val_accuracies, strict=True))
    ]
    phases = dict.fromkeys(PHASES, 0.0)
    phases.update(phase_seconds or {"compute": 1.0, "exchange": 1.0})
    return {
        "ranks": ranks,
        "steps": steps,
        "global_batch_size": 16 * ranks,
        "val_accuracy": val_accuracies[-1],
        "history": history,
        "wall_seconds": sum(epoch_seconds) + 1.0,
        "phase_seconds": phases,
        "gradient_bytes_raw": wire_bytes * 100,
        "gradient_bytes_wire": wire_bytes,
        "compression_ratio": 100.0,
    }


def result(
    spec: RunSpec,
    run_summary: dict[str, Any] | None,
    *,
    status: str = "ok",
    cycle_time_ms: float = 20.0,
    resources: dict[str, DeviceResources] | None = None,
    tmp_dir: Path = Path("/nonexistent"),
) -> RunResult:
    """A RunResult for `spec` as the runner would have built it."""
    accounting = None
    if run_summary is not None:
        accounting = {
            "devices": [
                {"device": f"d{i}", "tx_bytes": 5000, "rx_bytes": 4000}
                for i in range(spec.fleet.devices)
            ],
            "mean_tx_bytes": 5000.0,
            "coordination_payload_bytes_per_second": 100.0,
        }
    return RunResult(
        spec=spec,
        status=status,
        run_id=f"test-{spec.label}",
        run_dir=tmp_dir / spec.label,
        cycle_time_ms=cycle_time_ms,
        link=LinkProfile("lte", 5000, 17500, up_delay_ms=35, down_delay_ms=35),
        train_command="globaldl train " + " ".join(spec.train_args),
        fleet_command="globaldl fleet run -- " + " ".join(spec.train_args),
        latency_emulated=False,
        run_seconds=60.0,
        summary=run_summary,
        accounting=accounting,
        resources=resources or {},
    )


def device_resources(
    device: str, *, cpu_seconds: float, memory_mb: float, sent_bytes: float
) -> DeviceResources:
    """What one device's scrapes would have given over a 10 s window."""
    return DeviceResources(
        device=device,
        scrapes=11,
        window_seconds=10.0,
        steps=20,
        cpu_seconds=cpu_seconds,
        cpu_percent_of_device=100 * cpu_seconds / (10.0 * 0.5),
        resident_memory_peak_bytes=memory_mb * 2**20,
        resident_memory_mean_bytes=memory_mb * 2**20 * 0.9,
        network_transmit_bytes=sent_bytes,
        network_receive_bytes=sent_bytes / 2,
        scrape_response_bytes=2000,
    )
