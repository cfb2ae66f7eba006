"""`scale`: how many LeNet devices this machine trains, what each needs, and do the links hold.

Fleets of 16, 20, 24, 28 and 32 devices share the machine's cores evenly (2 cores: 1/8 to
1/16 core each) on delayed LTE links (vde2) and train LeNet with top-k + int8 for three short
epochs. Each device's exporter is scraped for its worker's memory; the 16-device fleet runs
with TensorFlow's default thread pools and with single-threaded ones, the larger fleets
single-threaded. While the single-threaded 16-device fleet trains, device 1's path to the core
is measured (round trip, then a bulk transfer): the user-space links must still deliver their
profile while the devices use every core.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from globaldl.experiments.analysis import TargetCheck
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import number_or_none, save_figure
from globaldl.experiments.runner import RunResult
from globaldl.experiments.spec import (
    LENET_MNIST,
    Fault,
    FleetConfig,
    RunSpec,
    compression_args,
)
from globaldl.fleet.system import machine_cores

DEVICE_COUNTS: tuple[int, ...] = (16, 20, 24, 28, 32)
QUICK_DEVICE_COUNTS: tuple[int, ...] = (4, 6)
PROFILE = "lte"
COMPRESSION = "prune+quantize"
EPOCHS, STEPS_PER_EPOCH = 3, 8
SINGLE_THREADED = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
# TensorFlow starts in ~6 CPU seconds: at 1/16 core that is over a minute and a half per device.
START_TIMEOUT_SECONDS = 900
LINK_TOLERANCE = 0.10
MB = 2**20


class ScaleExperiment(Experiment):
    """The largest LeNet fleet that still trains, memory per worker, links under full load."""

    name = "scale"
    title = "Fleet size: the largest fleet that trains, memory per worker, links under load"
    columns = (
        "devices",
        "threads",
        "cpu_cores_per_device",
        "status",
        "steps_per_rank",
        "val_accuracy",
        "mean_step_seconds",
        "worker_memory_peak_mb_median",
        "worker_memory_peak_mb_max",
        "fleet_memory_peak_mb",
        "emulation_cpu_cores_mean",
        "link_round_trip_ms",
        "link_round_trip_expected_ms",
        "link_rate_mbit_per_second",
        "link_rate_shaped_mbit_per_second",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        device_counts: Sequence[int] | None = None,
        cores: float | None = None,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.device_counts = tuple(
            device_counts or (QUICK_DEVICE_COUNTS if quick else DEVICE_COUNTS)
        )
        self.cores = float(cores if cores is not None else machine_cores())
        self.workload = LENET_MNIST

    @property
    def reference_devices(self) -> int:
        """The fleet size measured with both thread settings and with the link check."""
        return self.device_counts[0]

    def plan(self) -> list[RunSpec]:
        """Each fleet size once (single-threaded); the smallest also with default threads."""
        specs = []
        for devices in self.device_counts:
            fleet = FleetConfig(devices, PROFILE, self.cores / devices)
            variants = [("1", SINGLE_THREADED)]
            if devices == self.reference_devices:
                variants.insert(0, ("default", {}))
            for threads, env in variants:
                measured = devices == self.reference_devices and threads == "1"
                specs.append(
                    RunSpec(
                        experiment=self.name,
                        label=f"lenet-n{devices}-threads-{threads}",
                        fleet=fleet,
                        train_args=(
                            *self.workload.train_args,
                            *self.workload.learning_rate_args(devices),
                            "--batch-size",
                            "16",
                            "--epochs",
                            str(EPOCHS),
                            "--max-steps-per-epoch",
                            str(STEPS_PER_EPOCH),
                            *compression_args(COMPRESSION),
                            "--seed",
                            "0",
                        ),  # fmt: skip
                        factors={"devices": devices, "threads": threads},
                        cycle_time_ms=self.cycle_time_ms,
                        scrape_metrics=True,
                        timeout_seconds=3600.0,
                        fleet_run_args=("--start-timeout-seconds", str(START_TIMEOUT_SECONDS)),
                        env=env,
                        # Once the first epoch is done every device trains: measure then.
                        faults=(Fault("measure", 1, r"epoch 1/"),) if measured else (),
                    )
                )
        return specs

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run: memory per worker, the emulation's CPU, the link check."""
        rows = []
        for result in results:
            row = run_row(result)
            peaks = [r.resident_memory_peak_bytes / MB for r in result.resources.values()]
            if peaks:
                row["worker_memory_peak_mb_median"] = median(peaks)
                row["worker_memory_peak_mb_max"] = max(peaks)
                row["fleet_memory_peak_mb"] = sum(peaks)
            links = _links_record(result)
            if links is not None:
                row["emulation_cpu_cores_mean"] = links.get("emulation_cpu_cores_mean")
            measured = next((fault["result"] for fault in result.faults if "result" in fault), None)
            if measured is not None:
                round_trip, rate = measured.get("round_trip", {}), measured.get("rate", {})
                row["link_round_trip_ms"] = round_trip.get("round_trip_ms_median")
                row["link_round_trip_expected_ms"] = round_trip.get("expected_round_trip_ms")
                row["link_rate_mbit_per_second"] = rate.get("frame_bits_per_second", 0) / 1e6
                row["link_rate_shaped_mbit_per_second"] = (
                    rate.get("shaped_bits_per_second", 0) / 1e6
                )
                row["link_emulation_cpu_cores"] = measured.get("emulation_cpu_cores")
            rows.append(row)
        return rows

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """16 devices train; the largest fleet that trains; the links hold under load."""
        trained = sorted({row["devices"] for row in rows if row["status"] == "ok"})
        reference = [row for row in rows if row["devices"] == self.reference_devices]
        checks = [
            TargetCheck(
                f"{self.reference_devices} devices train LeNet on this machine",
                ", ".join(f"threads {row['threads']}: {row['status']}" for row in reference)
                or "no run",
                any(row["status"] == "ok" for row in reference) if reference else None,
            ),
            TargetCheck(
                "the largest fleet that still trains (reported)",
                f"{max(trained)} devices (ok: {', '.join(map(str, trained))} of "
                f"{', '.join(map(str, self.device_counts))})"
                if trained
                else "none",
                None,
            ),
        ]
        measured = [row for row in reference if "link_rate_mbit_per_second" in row]
        if not measured:
            checks.append(
                TargetCheck(
                    "links hold their profile while the fleet trains", "no measurement", None
                )
            )
            return checks
        row = measured[0]
        rate_error = row["link_rate_mbit_per_second"] / row["link_rate_shaped_mbit_per_second"] - 1
        rtt, expected = row["link_round_trip_ms"], row["link_round_trip_expected_ms"]
        rtt_error = rtt / expected - 1 if rtt is not None and expected else None
        checks.append(
            TargetCheck(
                f"while {row['devices']} devices train, device 1's link delivers its profile "
                f"(rate and round trip within {LINK_TOLERANCE:.0%})",
                f"rate {row['link_rate_mbit_per_second']:.2f} of "
                f"{row['link_rate_shaped_mbit_per_second']:g} Mbit/s ({rate_error:+.1%}); round "
                + (
                    f"trip {rtt:.1f} ms vs {expected:.1f} ms ({rtt_error:+.1%})"
                    if rtt_error is not None
                    else "trip not measured"
                ),
                rate_error >= -LINK_TOLERANCE
                and rtt_error is not None
                and abs(rtt_error) <= LINK_TOLERANCE,
            )
        )
        return checks

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """scale.png: memory per worker and step time against fleet size."""

        def draw(figure: Any) -> None:
            memory_axis, step_axis = figure.subplots(1, 2)
            for threads, marker in (("1", "o"), ("default", "s")):
                mine = sorted(
                    (row for row in rows if row["threads"] == threads), key=lambda r: r["devices"]
                )
                for axis, column in (
                    (memory_axis, "worker_memory_peak_mb_median"),
                    (step_axis, "mean_step_seconds"),
                ):
                    points = [(row["devices"], number_or_none(row.get(column))) for row in mine]
                    points = [(n, v) for n, v in points if v is not None]
                    if points:
                        axis.plot(
                            *zip(*points, strict=True), marker=marker, label=f"threads {threads}"
                        )
            memory_axis.set_ylabel("peak resident memory per worker, MB (median)")
            step_axis.set_ylabel("mean step seconds")
            for axis in (memory_axis, step_axis):
                axis.set_xlabel("devices (machine cores shared evenly)")
                axis.grid(True, alpha=0.3)
                axis.legend(fontsize=7)
            memory_axis.set_title(f"LeNet, {COMPRESSION}, {PROFILE} links", fontsize=9)

        return [save_figure(out_dir / "scale.png", draw, width_inches=10, height_inches=4.2)]

    def method(self) -> str:
        """How the runs are built, and how long they take."""
        return (
            f"Fleets of {', '.join(map(str, self.device_counts))} devices, the machine's "
            f"{self.cores:g} cores shared evenly, memory limit per device the default (2 GB or an "
            f"even share), `{PROFILE}` links (vde2: 35 ms each way), LeNet/MNIST with "
            f"{COMPRESSION}, {EPOCHS} epochs of {STEPS_PER_EPOCH} steps, local batch 16, "
            f"{self.workload.learning_rate_text()}. "
            "Memory is each worker's peak resident set from its exporter (shared library pages "
            "count in every worker, so the fleet's sum overstates the machine's use). "
            f"`threads 1` sets {', '.join(f'{k}=1' for k in SINGLE_THREADED)}; `default` keeps the "
            "trainer's split of the machine's cores. The link check (`link_*`) is `globaldl "
            "fleet measure` of device 1 to the core, started when epoch 1 ends. "
            "`emulation_cpu_cores_mean` is the vde2 processes' CPU over the run (outside the "
            "devices' quotas). Expected duration on a quiet 2-core machine: ~50 minutes (start-up "
            "dominates: TensorFlow at 1/16 core takes minutes)."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "device_counts": list(self.device_counts),
            "cores": self.cores,
            "profile": PROFILE,
            "compression": COMPRESSION,
            "epochs": EPOCHS,
            "steps_per_epoch": STEPS_PER_EPOCH,
        }


def _links_record(result: RunResult) -> dict[str, Any] | None:
    """What `fleet run` wrote beside the summary: link settings and emulation CPU."""
    import json

    path = result.run_dir / "summary.links.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
