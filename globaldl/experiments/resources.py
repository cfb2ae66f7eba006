"""`resources`: CPU, memory and network per device across MLP depth x batch size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import number_or_none, save_figure, write_csv
from globaldl.experiments.runner import DEFAULT_SCRAPE_INTERVAL_SECONDS, RunResult
from globaldl.experiments.spec import FleetConfig, RunSpec

MEBIBYTE = 2**20


class ResourcesExperiment(Experiment):
    """The edge-training paper's resource table, read from globaldl's own monitoring.

    Every worker serves its exporter (`--metrics-port`; `fleet run` binds it to the device's
    own address); the runner scrapes each device's exporter every second while the run lasts
    (globaldl/experiments/scrape.py says which metric gives which column and why).
    """

    name = "resources"
    title = "CPU, memory and network per device against layers x batch size"
    columns = (
        "layers",
        "batch_size",
        "devices",
        "cpu_percent_of_device",
        "cpu_cores_used",
        "memory_peak_mb",
        "memory_mean_mb",
        "network_sent_kb",
        "network_received_kb",
        "interface_sent_kb",
        "interface_received_kb",
        "window_seconds",
        "val_accuracy",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        layers: Sequence[int] | None = None,
        batch_sizes: Sequence[int] | None = None,
        devices: int | None = None,
        profile: str = "lte",
        cpu_cores_per_device: float = 0.5,
        epochs: int | None = None,
        max_steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.layers = tuple(layers or ((1, 5) if quick else (1, 3, 5)))
        self.batch_sizes = tuple(batch_sizes or (16, 64))
        self.devices = devices or (2 if quick else 4)
        self.profile = profile
        self.cpu_cores_per_device = cpu_cores_per_device
        # Resource use settles within tens of steps (the exporters are scraped every second);
        # dense MLP steps take ~2 s on a 5 Mbit/s uplink, so the full version runs 40 per size.
        self.epochs = epochs or 1
        self.max_steps_per_epoch = max_steps_per_epoch or (10 if quick else 40)

    def plan(self) -> list[RunSpec]:
        """One fleet; an MLP run per layers x batch size, each scraped."""
        fleet = FleetConfig(self.devices, self.profile, self.cpu_cores_per_device)
        specs = []
        for layers in self.layers:
            for batch_size in self.batch_sizes:
                args = [
                    "--model",
                    "mlp",
                    "--dataset",
                    "mnist",
                    "--layers",
                    str(layers),
                    "--batch-size",
                    str(batch_size),
                    "--epochs",
                    str(self.epochs),
                ]
                if self.max_steps_per_epoch is not None:
                    args += ["--max-steps-per-epoch", str(self.max_steps_per_epoch)]
                specs.append(
                    RunSpec(
                        experiment=self.name,
                        label=f"mlp-l{layers}-b{batch_size}",
                        fleet=fleet,
                        train_args=(*args, "--seed", "0"),
                        factors={"layers": layers, "batch_size": batch_size},
                        cycle_time_ms=self.cycle_time_ms,
                        scrape_metrics=True,
                    )
                )
        return specs

    @staticmethod
    def device_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per device per run, straight from the scrapes."""
        rows = []
        for result in results:
            for name, resources in sorted(result.resources.items()):
                rows.append(
                    {
                        "label": result.spec.label,
                        **result.spec.factors,
                        "device": name,
                        "scrapes": resources.scrapes,
                        "window_seconds": resources.window_seconds,
                        "steps_in_window": resources.steps,
                        "cpu_seconds": resources.cpu_seconds,
                        "cpu_percent_of_device": resources.cpu_percent_of_device,
                        "memory_peak_mb": resources.resident_memory_peak_bytes / MEBIBYTE,
                        "memory_mean_mb": resources.resident_memory_mean_bytes / MEBIBYTE,
                        "network_sent_kb": resources.network_transmit_bytes / 1000,
                        "network_received_kb": resources.network_receive_bytes / 1000,
                        "scrape_response_kb": resources.scrape_response_bytes / 1000,
                    }
                )
        return rows

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per configuration: the mean over its devices (memory: the largest peak)."""
        rows = []
        for result in results:
            row = run_row(result)
            devices = list(result.resources.values())
            row["devices_scraped"] = len(devices)
            if devices:
                window = [d.window_seconds for d in devices]
                cpu_percent = [
                    d.cpu_percent_of_device for d in devices if d.cpu_percent_of_device is not None
                ]
                row.update(
                    {
                        "window_seconds": sum(window) / len(window),
                        "cpu_percent_of_device": (
                            sum(cpu_percent) / len(cpu_percent) if cpu_percent else None
                        ),
                        "cpu_cores_used": (
                            sum(
                                d.cpu_seconds / d.window_seconds
                                for d in devices
                                if d.window_seconds > 0
                            )
                            / len(devices)
                        ),
                        "memory_peak_mb": max(d.resident_memory_peak_bytes for d in devices)
                        / MEBIBYTE,
                        "memory_mean_mb": sum(d.resident_memory_mean_bytes for d in devices)
                        / len(devices)
                        / MEBIBYTE,
                        "network_sent_kb": sum(d.network_transmit_bytes for d in devices)
                        / len(devices)
                        / 1000,
                        "network_received_kb": sum(d.network_receive_bytes for d in devices)
                        / len(devices)
                        / 1000,
                        "scrape_response_kb": sum(d.scrape_response_bytes for d in devices)
                        / len(devices)
                        / 1000,
                    }
                )
            if result.accounting is not None:
                counted = result.accounting["devices"]
                row["interface_sent_kb"] = sum(d["tx_bytes"] for d in counted) / len(counted) / 1000
                row["interface_received_kb"] = (
                    sum(d["rx_bytes"] for d in counted) / len(counted) / 1000
                )
            rows.append(row)
        return rows

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """resources.png: CPU, memory, network sent and received per configuration."""
        panels = (
            ("cpu_percent_of_device", "CPU, % of the device's quota"),
            ("memory_peak_mb", "peak resident memory, MB"),
            ("network_sent_kb", "network sent per device, kB"),
            ("network_received_kb", "network received per device, kB"),
        )
        names = [f"L{row['layers']} b{row['batch_size']}" for row in rows]

        def draw(figure: Any) -> None:
            axes = figure.subplots(2, 2).flatten()
            for axis, (column, label) in zip(axes, panels, strict=True):
                values = [number_or_none(row.get(column)) or 0.0 for row in rows]
                axis.bar(names, values, color="tab:blue")
                axis.set_title(label, fontsize=9)
                axis.tick_params(axis="x", labelsize=8)
                axis.grid(axis="y", alpha=0.3)
            figure.suptitle(
                f"MLP on MNIST, {self.devices} devices x {self.cpu_cores_per_device:g} cores, "
                f"{self.profile} links (mean per device)",
                fontsize=9,
            )

        return [save_figure(out_dir / "resources.png", draw, width_inches=9, height_inches=6)]

    def extra_outputs(self, results: Sequence[RunResult], out_dir: Path) -> list[Path]:
        """resources-devices.csv: one row per device per run."""
        return [write_csv(out_dir / "resources-devices.csv", self.device_rows(results))]

    def extra_markdown(self, results: Sequence[RunResult]) -> str:
        """The per-device table."""
        from globaldl.markdown import markdown_table

        columns = [
            "label",
            "device",
            "scrapes",
            "window_seconds",
            "cpu_percent_of_device",
            "memory_peak_mb",
            "network_sent_kb",
            "network_received_kb",
            "scrape_response_kb",
        ]
        return "## Per device\n\n" + markdown_table(self.device_rows(results), columns)

    def method(self) -> str:
        """How the runs are built and where each number comes from."""
        return (
            f"MLP (`--model mlp --layers L`, width 128) on MNIST, layers "
            f"{', '.join(map(str, self.layers))} x batch size "
            f"{', '.join(map(str, self.batch_sizes))}; {self.devices} devices with "
            f"{self.cpu_cores_per_device:g} cores each on `{self.profile}` links, "
            f"{self.epochs} epoch(s)"
            + (
                f" of {self.max_steps_per_epoch} steps per device"
                if self.max_steps_per_epoch
                else ""
            )
            + ", no compression.\n\n"
            "Source of the numbers: **globaldl's own exporter, scraped** from the host every "
            f"{DEFAULT_SCRAPE_INTERVAL_SECONDS:g} s during each run (`globaldl train "
            "--metrics-port`, bound to each device's address by `fleet run`). The window runs "
            "from the first to the last successful scrape of a device (the exporter lives from "
            "just before the weight broadcast to one last scrape after training). "
            "`cpu_percent_of_device` = growth of `globaldl_process_cpu_seconds_total` / window "
            "/ the device's CPU quota; `memory_*_mb` = `globaldl_process_resident_memory_bytes` "
            "(the worker's RSS; peak over devices, mean over scrapes and devices); "
            "`network_*_kb` = growth of `globaldl_device_network_transmit/receive_bytes_total` "
            "(psutil reads /proc/net/dev, which is per network namespace, i.e. per device: eth0 "
            "plus loopback), mean over devices. They include the scrapes' own responses "
            "(`scrape_response_kb`). Machine-wide readings (`globaldl_device_cpu_utilization_"
            "ratio`, `globaldl_device_memory_used_bytes`) are not used: psutil reads them from "
            "/proc/stat and /proc/meminfo, which namespaces do not separate. For comparison, "
            "`interface_*_kb` are the fleet's eth0 counters over the whole `fleet run` (start-up "
            "included). Per-device numbers: `resources-devices.csv`."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "layers": list(self.layers),
            "batch_sizes": list(self.batch_sizes),
            "devices": self.devices,
            "profile": self.profile,
            "cpu_cores_per_device": self.cpu_cores_per_device,
            "epochs": self.epochs,
            "max_steps_per_epoch": self.max_steps_per_epoch,
        }
