"""`sites`: 16 devices in 4 sites (a fast LAN each, one shared LTE uplink per site).

The same 16 devices also run flat, each on its own LTE link, for comparison. Both train LeNet
with top-k + int8. With sites, `fleet run` passes the site map (`--sites-file`) when the
trainer reads it; the run's summary says which exchange it used (`exchange.hierarchy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from globaldl.experiments.analysis import seconds_or_not_reached, time_to_target
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.runner import RunResult
from globaldl.experiments.spec import LENET_MNIST, FleetConfig, RunSpec, compression_args
from globaldl.fleet.system import machine_cores

SITES, DEVICES_PER_SITE = 4, 4
QUICK_SITES, QUICK_DEVICES_PER_SITE = 2, 2
LAN, WAN = "lan", "lte"
COMPRESSION = "prune+quantize"
EPOCHS = 8
"""120 updates at 16 devices (15 steps an epoch). One LeNet process at the 16-device global
batch (256) and the capped rate 0.08 reached 0.885 after 4 epochs of 15 steps and 0.92-0.96
from the 5th (README, sites); compression needs about one epoch more (ablation)."""


class SitesExperiment(Experiment):
    """One 16-device run in 4 sites, and the same devices flat, each on its own LTE link."""

    name = "sites"
    title = "16 devices in 4 sites behind shared LTE uplinks, against 16 flat LTE devices"
    columns = (
        "layout",
        "devices",
        "profile",
        "status",
        "steps_per_rank",
        "val_accuracy",
        "seconds_to_target",
        "mean_step_seconds",
        "device_tx_bytes_per_step",
        "hierarchy",
        "wall_seconds",
    )

    def __init__(self, *, quick: bool = False, cycle_time_ms: float | None = None) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.sites = QUICK_SITES if quick else SITES
        self.per_site = QUICK_DEVICES_PER_SITE if quick else DEVICES_PER_SITE
        self.workload = LENET_MNIST

    def plan(self) -> list[RunSpec]:
        """The sites run first (the one asked for), then the flat comparison (not when quick)."""
        devices = self.sites * self.per_site
        cores = machine_cores() / devices
        layouts = {
            "sites": FleetConfig(
                devices, WAN, cores, sites=f"{self.sites}x{self.per_site}", lan=LAN
            )
        }
        if not self.quick:
            layouts["flat"] = FleetConfig(devices, WAN, cores)
        return [
            RunSpec(
                experiment=self.name,
                label=f"lenet-{layout}-{devices}",
                fleet=fleet,
                train_args=(
                    *self.workload.train_args,
                    *self.workload.learning_rate_args(devices),
                    "--batch-size",
                    "16",
                    "--epochs",
                    str(1 if self.quick else EPOCHS),
                    *compression_args(COMPRESSION),
                    "--seed",
                    "0",
                ),  # fmt: skip
                factors={"layout": layout},
                cycle_time_ms=self.cycle_time_ms,
                timeout_seconds=3600.0,
                fleet_run_args=("--start-timeout-seconds", "600"),
            )
            for layout, fleet in layouts.items()
        ]

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per layout."""
        rows = []
        for result in results:
            row = run_row(result)
            if result.summary is not None:
                row["seconds_to_target"] = seconds_or_not_reached(
                    time_to_target(result.summary["history"], self.workload.target_accuracy)
                )
                row["hierarchy"] = (result.summary.get("exchange") or {}).get("hierarchy", "none")
            rows.append(row)
        return rows

    def method(self) -> str:
        """How the runs are built, and how long they take."""
        devices = self.sites * self.per_site
        return (
            f"{devices} devices, the machine's cores shared evenly. `sites`: `globaldl fleet up "
            f"--sites {self.sites}x{self.per_site} --lan {LAN} --wan {WAN}`: each site's devices "
            f"on their own bridge with {LAN} links (1000 Mbit/s, no delay), each site joined to "
            f"the core by ONE {WAN} link (5 Mbit/s up, 17.5 down, 35 ms each way) that all its "
            f"devices share; across sites a packet crosses two WAN links (140 ms round trip). "
            f"`flat`: every device on its own {WAN} link. LeNet/MNIST, {COMPRESSION}, local "
            f"batch 16, {1 if self.quick else EPOCHS} epochs, "
            f"{self.workload.learning_rate_text()}. `hierarchy` is what the run "
            "summary reports about the exchange (`none` when the trainer does not read site "
            "maps). Expected duration of the full plan on a quiet 2-core machine: ~35 minutes "
            "per repeat (measured 2026-11-27: 13-14 min in sites, 20-21 min flat, start-up "
            "included)."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "sites": self.sites,
            "devices_per_site": self.per_site,
            "lan": LAN,
            "wan": WAN,
            "compression": COMPRESSION,
        }
