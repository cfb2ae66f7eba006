"""`scaling`: does per-device traffic stay flat as devices are added? Every exchange mode.

LeNet/MNIST trains for a fixed number of epochs on 2, 4, 8 and 16 devices, each on its own
delayed link (the `lte` profile: 5 Mbit/s up, 17.5 down, 35 ms each way), with every exchange
mode: dense Horovod (fp32 ring allreduce), Horovod's fp16, per-rank top-k + int8 (gathered), and
each summable codec (shared-randomk + intsum, shared-topk + intsum, PowerSGD + fp16). Then 16
devices in 4 sites (a LAN per site, one delayed WAN link per site) run the flat ring and the
site hierarchy (`--hierarchy sites`) with dense and with shared-topk + intsum. Per run:
per-device interface tx bytes per step (the devices' own counters: the truth for the network)
over the steady steps and over the whole run, the modelled collective bytes, step time, time to
accuracy and final accuracy. The targets read the steady bytes: a 16-device run makes 30 steps,
so the model's initial broadcast alone, spread over the whole run, would outweigh a summable
codec's step. `plan()` is one repeat; the benchmark protocol repeats and aggregates it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from globaldl.experiments.aggregate import error_bars, row_spread
from globaldl.experiments.analysis import (
    TargetCheck,
    at_least_times_sooner,
    at_most_times,
    ratio,
    seconds_or_not_reached,
    steady_step_seconds,
    time_to_target,
)
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import number_or_none, save_figure
from globaldl.experiments.results import RunResult
from globaldl.experiments.spec import LENET_MNIST, FleetConfig, RunSpec, Workload, slug
from globaldl.fleet.sites import grid_shape
from globaldl.hierarchy import Hierarchy

DENSE = "dense"
CODECS: dict[str, tuple[str, ...]] = {
    DENSE: (),
    "fp16": ("--quantize", "fp16"),
    "topk+int8": ("--prune", "topk", "--density", "0.01", "--quantize", "int8"),
    "shared-randomk+intsum": (
        "--prune",
        "shared-randomk",
        "--density",
        "0.01",
        "--quantize",
        "intsum",
    ),
    "shared-topk+intsum": ("--prune", "shared-topk", "--density", "0.01", "--quantize", "intsum"),
    "powersgd+fp16": ("--prune", "powersgd", "--powersgd-rank", "2", "--quantize", "fp16"),
}
"""Every exchange mode, as `globaldl train` arguments."""

SUMMABLE = ("shared-randomk+intsum", "shared-topk+intsum", "powersgd+fp16")
RECOMMENDED_SUMMABLE = "shared-topk+intsum"
DEVICE_COUNTS, QUICK_DEVICE_COUNTS = (2, 4, 8, 16), (2, 4)
SITES, QUICK_SITES = (4, 4), (2, 2)  # sites x devices per site
LINK = "lte"
"""Each device's link (flat fleets) and each site's WAN link: a named profile with latency
(deploy/fleet/profiles.yaml: 35 ms each way, so 70 ms device to device across the core;
`custom:UP_MBIT:DOWN_MBIT:DELAY_MS` works too)."""
LAN_PROFILE = "lan"
FLEET_CPU_CORES = 2.0
"""Every fleet shares the reference machine's 2 cores evenly (1 core each at 2 devices, 1/8 at
16): the comparison is about the network, and small fleets then start and step quickly."""
EPOCHS = 2
EXPECTED_MINUTES = 215
"""One repeat on 2 cores (28 runs), from repeat 1's single runs of 2026-11-27 (`globaldl
experiment scaling --repeats 3 --busy rerun --max-reruns 1 --resume`): 206 minutes of runs plus
five fleet starts. The 2-device runs took 24 minutes together, the 4-device runs 5-9 minutes
each, the 8-device runs 6-11 minutes, the 16-device runs 9-13 minutes (run times 513-803 s:
PowerSGD and the site hierarchy the longest)."""
FLAT_BYTES_FACTOR = 1.3
LESS_TRAFFIC_FACTOR = 50.0
ACCURACY_POINTS = 0.005
HIERARCHY_SPEEDUP = 2.0
TRAFFIC = "steady_tx_bytes_per_step"
"""The column the traffic targets and ratios read (see the module docstring)."""


def steady_tx_bytes_per_step(result: RunResult) -> float | None:
    """Mean over the fleet's devices of what each sent per step in its steady window.

    None unless every device was scraped over a steady window (globaldl/experiments/scrape.py).
    """
    per_device = [
        resources.steady_transmit_bytes_per_step for resources in result.resources.values()
    ]
    known = [value for value in per_device if value is not None]
    return sum(known) / len(known) if len(known) == result.spec.fleet.devices else None


def mean_device_model_bytes(
    model_bytes: float | None, fleet: FleetConfig, hierarchy: str | None
) -> float | None:
    """The average device's modelled bytes per step, from the summary's busiest device's.

    Flat, every device sends the same. Under the site hierarchy the summary models a site
    leader; the steady bytes average all devices, so they are compared with the average
    device's share (Hierarchy.mean_tx_bytes). None for sites from a file (sizes unknown here).
    """
    if model_bytes is None or hierarchy in (None, "none"):
        return model_bytes
    shape = grid_shape(fleet.sites) if fleet.sites else None
    if shape is None:
        return None
    layout = Hierarchy.grid(*shape)
    return model_bytes * layout.mean_tx_bytes(1.0) / layout.leader_tx_bytes(1.0)


def beyond_model_tx_bytes_per_second(
    steady_bytes: float | None, model_bytes: float | None, step_seconds: float | None
) -> float | None:
    """What a device sent per second of steady step beyond its collectives' gradient payload.

    Frame headers, Horovod's coordination (it runs every cycle, so its bytes per step grow
    with the step's length) and the scrapes' headers. Nearly the same figure across codecs
    and fleet sizes says the excess follows time, not devices; None when a part is unknown.
    """
    if steady_bytes is None or model_bytes is None or not step_seconds:
        return None
    return (steady_bytes - model_bytes) / step_seconds


class ScalingExperiment(Experiment):
    """Per-device traffic, step time and accuracy against devices, for every exchange mode."""

    name = "scaling"
    title = "Per-device traffic as devices are added: gathered, summed and hierarchical"
    columns = (
        "codec",
        "fleet",
        "exchange",
        "devices",
        "combine",
        "collectives_per_step",
        "steady_tx_bytes_per_step",
        "device_tx_bytes_per_step",
        "device_tx_bytes_per_step_model",
        "beyond_model_tx_bytes_per_second",
        "traffic_ratio_vs_dense",
        "steady_step_seconds",
        "seconds_to_target",
        "val_accuracy",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        device_counts: Sequence[int] | None = None,
        codecs: Sequence[str] | None = None,
        sites: tuple[int, int] | None = None,
        link: str | None = None,
        cpu_cores_per_device: float | None = None,
        epochs: int | None = None,
        workload: Workload = LENET_MNIST,
        batch_size: int = 16,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.device_counts = tuple(
            device_counts or (QUICK_DEVICE_COUNTS if quick else DEVICE_COUNTS)
        )
        if sorted(set(self.device_counts)) != list(self.device_counts) or self.device_counts[0] < 2:
            raise ValueError(
                f"device_counts must be increasing whole numbers >= 2, got {self.device_counts}"
            )
        self.codecs = tuple(codecs or ((DENSE, RECOMMENDED_SUMMABLE) if quick else CODECS))
        unknown = [codec for codec in self.codecs if codec not in CODECS]
        if unknown or DENSE not in self.codecs:
            raise ValueError(
                f"codecs must include {DENSE!r} (the baseline) and be among {list(CODECS)}; "
                f"got {list(self.codecs)}"
            )
        self.sites = sites or (QUICK_SITES if quick else SITES)
        self.link = link or LINK
        self.cpu_cores_per_device = cpu_cores_per_device
        self.epochs = epochs or (1 if quick else EPOCHS)
        self.max_steps_per_epoch = 6 if quick else None
        self.workload = workload
        self.batch_size = batch_size
        self.hierarchy_codecs = tuple(
            codec for codec in (DENSE, RECOMMENDED_SUMMABLE) if codec in self.codecs
        )

    # ---------------------------------------------------------------------------- the plan
    def _args(self, codec: str, devices: int) -> list[str]:
        args = [
            *self.workload.train_args,
            *self.workload.learning_rate_args(devices),
            "--batch-size",
            str(self.batch_size),
            "--epochs",
            str(self.epochs),
        ]
        if self.max_steps_per_epoch is not None:
            args += ["--max-steps-per-epoch", str(self.max_steps_per_epoch)]
        return [*args, *CODECS[codec], "--seed", "0"]

    def plan(self) -> list[RunSpec]:
        """One fleet per device count (every codec on it), then the site fleet (ring, sites)."""
        specs = []
        for devices in self.device_counts:
            fleet = FleetConfig(devices, self.link, self._cpu(devices))
            for codec in self.codecs:
                specs.append(
                    RunSpec(
                        experiment=self.name,
                        label=f"{slug(codec)}-n{devices}",
                        fleet=fleet,
                        train_args=tuple(self._args(codec, devices)),
                        factors={
                            "codec": codec,
                            "fleet": "flat",
                            "exchange": "ring",
                        },
                        cycle_time_ms=self.cycle_time_ms,
                        scrape_metrics=True,
                    )
                )
        count, per_site = self.sites
        sites = f"{count}x{per_site}"
        site_fleet = FleetConfig(
            count * per_site, self.link, self._cpu(count * per_site), sites=sites, lan=LAN_PROFILE
        )
        for codec in self.hierarchy_codecs:
            for exchange in ("ring", "hierarchy"):
                hierarchy = ["--hierarchy", "sites"] if exchange == "hierarchy" else []
                specs.append(
                    RunSpec(
                        experiment=self.name,
                        label=f"{slug(codec)}-sites{sites}-{exchange}",
                        fleet=site_fleet,
                        train_args=tuple(self._args(codec, count * per_site) + hierarchy),
                        factors={"codec": codec, "fleet": f"sites {sites}", "exchange": exchange},
                        cycle_time_ms=self.cycle_time_ms,
                        scrape_metrics=True,
                    )
                )
        return specs

    def _cpu(self, devices: int) -> float:
        """CPU cores per device: as given, or the machine's cores shared by the fleet."""
        return self.cpu_cores_per_device or FLEET_CPU_CORES / devices

    # ---------------------------------------------------------------------------- the rows
    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run (repeats included), with what the run summary says ran."""
        rows = []
        for result in results:
            row = run_row(result)
            row["target_accuracy"] = self.workload.target_accuracy
            row[TRAFFIC] = steady_tx_bytes_per_step(result)
            summary = result.summary
            if summary is not None:
                row.update(summary.get("exchange", {}))
                # Without the first step: it also traces the graph (seconds at 1/8 core, in a
                # run of 30 steps).
                row["steady_step_seconds"] = steady_step_seconds(summary)
                traffic = summary.get("traffic", {})
                row["device_tx_bytes_per_step_model"] = traffic.get(
                    "device_tx_bytes_per_step_model"
                )
                row["beyond_model_tx_bytes_per_second"] = beyond_model_tx_bytes_per_second(
                    row[TRAFFIC],
                    mean_device_model_bytes(
                        number_or_none(row["device_tx_bytes_per_step_model"]),
                        result.spec.fleet,
                        row.get("hierarchy"),
                    ),
                    row["steady_step_seconds"],
                )
                row["seconds_to_target"] = seconds_or_not_reached(
                    time_to_target(summary.get("history", []), self.workload.target_accuracy)
                )
            rows.append(row)
        return rows

    def aggregate(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Medians per run label, and traffic against dense Horovod's median on that fleet."""
        table = super().aggregate(rows)
        for row in table:
            dense = self._find(table, DENSE, row["devices"], row["fleet"], row["exchange"])
            row["traffic_ratio_vs_dense"] = ratio(
                number_or_none(dense.get(TRAFFIC)),
                number_or_none(row.get(TRAFFIC)),
            )
        return table

    @staticmethod
    def _find(
        rows: Sequence[dict[str, Any]],
        codec: str,
        devices: int,
        fleet: str = "flat",
        exchange: str = "ring",
    ) -> dict[str, Any]:
        return next(
            (
                row
                for row in rows
                if row.get("codec") == codec
                and row.get("devices") == devices
                and row.get("fleet") == fleet
                and row.get("exchange") == exchange
            ),
            {},
        )

    # ---------------------------------------------------------------------------- targets
    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """The three targets of issue 12 on medians, per summable codec (and hierarchy codec)."""
        smallest, largest = self.device_counts[0], self.device_counts[-1]
        dense_large = self._find(rows, DENSE, largest)
        checks = []
        for codec in (c for c in SUMMABLE if c in self.codecs):
            small, large = self._find(rows, codec, smallest), self._find(rows, codec, largest)
            checks.append(
                at_most_times(
                    f"{codec}: per-device interface tx bytes per steady step at {largest} devices "
                    f"within {FLAT_BYTES_FACTOR:g}x of {smallest} devices'",
                    row_spread(large, TRAFFIC),
                    row_spread(small, TRAFFIC),
                    FLAT_BYTES_FACTOR,
                    unit="B",
                )
            )
            checks.append(self._less_traffic_same_accuracy(codec, large, dense_large, largest))
        count, per_site = self.sites
        fleet = f"sites {count}x{per_site}"
        for codec in self.hierarchy_codecs:
            ring = self._find(rows, codec, count * per_site, fleet, "ring")
            tree = self._find(rows, codec, count * per_site, fleet, "hierarchy")
            goal = (
                f"{codec}, {count} sites x {per_site} ({self.link} WAN): hierarchical step "
                f"time at least {HIERARCHY_SPEEDUP:g}x below the flat ring's"
            )
            tree_step = row_spread(tree, "steady_step_seconds")
            ring_step = row_spread(ring, "steady_step_seconds")
            if tree_step is None or ring_step is None:
                checks.append(TargetCheck(goal, "missing runs", None))
                continue
            # Read as a speed-up (ring / hierarchy), so a slower hierarchy shows below 1x.
            checks.append(at_least_times_sooner(goal, tree_step, ring_step, HIERARCHY_SPEEDUP))
        return checks

    @staticmethod
    def _less_traffic_same_accuracy(
        codec: str, row: dict[str, Any], dense: dict[str, Any], devices: int
    ) -> TargetCheck:
        goal = (
            f"{codec} at {devices} devices: >= {LESS_TRAFFIC_FACTOR:g}x less per-device "
            f"traffic than dense Horovod, final accuracy within {100 * ACCURACY_POINTS:g} point "
            "of dense"
        )
        traffic = row_spread(row, TRAFFIC)
        dense_traffic = row_spread(dense, TRAFFIC)
        accuracy = row_spread(row, "val_accuracy")
        dense_accuracy = row_spread(dense, "val_accuracy")
        if traffic is None or dense_traffic is None or accuracy is None or dense_accuracy is None:
            return TargetCheck(goal, "missing runs", None)
        if traffic.median <= 0:
            return TargetCheck(goal, "no bytes counted on the interfaces", None)
        less = dense_traffic.ratio_to(traffic)
        # One-sided: ending above dense is no failure.
        met = (
            less.median >= LESS_TRAFFIC_FACTOR
            and accuracy.median >= dense_accuracy.median - ACCURACY_POINTS
        )
        return TargetCheck(
            goal,
            f"{less.text('x')} less; accuracy {accuracy.text()} vs dense "
            f"{dense_accuracy.text()} (medians)",
            met,
        )

    # ---------------------------------------------------------------------------- outputs
    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """scaling.png: bytes, step time and accuracy against devices; ring against sites."""
        panels = (
            (TRAFFIC, "per-device interface tx bytes per steady step", "log"),
            ("steady_step_seconds", "step seconds without the first (rank 0)", "log"),
            ("val_accuracy", "final validation accuracy", "linear"),
        )
        count, per_site = self.sites
        fleet = f"sites {count}x{per_site}"

        def draw(figure: Any) -> None:
            axes = figure.subplots(1, len(panels) + 1)
            for axis, (column, label, scale) in zip(axes, panels, strict=False):
                for index, codec in enumerate(self.codecs):
                    points = [
                        (n, row_spread(self._find(rows, codec, n), column))
                        for n in self.device_counts
                    ]
                    points = [(n, s) for n, s in points if s is not None and s.reached]
                    if points:
                        axis.errorbar(
                            [n for n, _ in points],
                            [s.median for _, s in points],
                            yerr=error_bars([s for _, s in points]),
                            marker="o",
                            capsize=3,
                            color=f"C{index}",
                            linestyle="-" if codec in SUMMABLE else "--",
                            label=codec,
                        )
                axis.set_xscale("log", base=2)
                axis.set_yscale(scale)
                axis.set_xticks(list(self.device_counts), [str(n) for n in self.device_counts])
                axis.set_xlabel("devices")
                axis.set_title(label, fontsize=9)
                axis.grid(alpha=0.3)
            axes[0].legend(fontsize=7)
            bars = axes[-1]
            names, seconds = [], []
            for codec in self.hierarchy_codecs:
                for exchange in ("ring", "hierarchy"):
                    value = number_or_none(
                        self._find(rows, codec, count * per_site, fleet, exchange).get(
                            "steady_step_seconds"
                        )
                    )
                    if value is not None:
                        names.append(f"{codec}\n{exchange}")
                        seconds.append(value)
            bars.barh(names, seconds, color="tab:orange")
            bars.set_xlabel("step seconds without the first")
            bars.set_title(f"{fleet}: flat ring vs hierarchy", fontsize=9)
            bars.tick_params(axis="y", labelsize=7)
            bars.grid(axis="x", alpha=0.3)
            figure.suptitle(
                f"{self.workload.name}, {self.epochs} epochs, {self._cpu_text()}, link "
                f"{self.link}; dashed: gathered or dense, solid: summable",
                fontsize=9,
            )

        return [save_figure(out_dir / "scaling.png", draw, width_inches=16, height_inches=4.5)]

    def method(self) -> str:
        """How the runs are built."""
        codecs = "; ".join(f"`{c}`: `{' '.join(CODECS[c]) or '(no flags)'}`" for c in self.codecs)
        count, per_site = self.sites
        return (
            f"{self.workload.name} (`{' '.join(self.workload.train_args)}`), local batch "
            f"{self.batch_size}, {self.epochs} epochs over each device's 1/N of the data "
            f"({self.workload.learning_rate_text()}), seed 0. Flat fleets of "
            f"{', '.join(map(str, self.device_counts))} devices, each device on its own link "
            f"`{self.link}`; {self._cpu_text()}. Codecs: {codecs}. "
            f"Then {count} sites x {per_site} devices (`fleet up --sites {count}x{per_site} "
            f"--lan {LAN_PROFILE} --wan {self.link}`: a LAN per site, one shared delayed WAN "
            "link per site) run each of "
            f"{', '.join(self.hierarchy_codecs)} with the flat ring and with "
            "`--hierarchy sites` (sum in the site, among the site leaders, back to the site; "
            "`fleet run` passes the site map). Every device's exporter is scraped each "
            "second: `steady_tx_bytes_per_step` is what a device's interface sent per step "
            "from the first scrape after step 1 to the first that saw the last step, less the "
            "scrape responses, averaged over the devices (coordination, epoch-end validation "
            "and logs included; the initial broadcast and the run's end not; the scrapes' "
            "HTTP and TCP headers remain): the truth for the network, and what the targets "
            "and `traffic_ratio_vs_dense` read; `device_tx_bytes_per_step` is the same over "
            "the whole run (the fleet's counters, broadcast included); "
            "`device_tx_bytes_per_step_model` is what the collectives' algorithms send for the "
            "gradients alone (run summary `traffic`; for the hierarchy, a site leader's); "
            "`beyond_model_tx_bytes_per_second` is the steady bytes less the average device's "
            "modelled bytes (under the hierarchy not the leader's: members send less), per "
            "second of steady step (frame headers and Horovod's coordination, which runs "
            "every cycle: it adds bytes per step as steps lengthen, and steps lengthen with N "
            "here because the fleet shares 2 cores); "
            "`traffic_ratio_vs_dense` divides dense Horovod's steady bytes on the same "
            "fleet by the run's. `collectives_per_step` and `combine` come from the run "
            "summary's `exchange` (the compressor's wire declaration). Target accuracy "
            f"{self.workload.target_accuracy:g}. One repeat takes about {EXPECTED_MINUTES} "
            "minutes on 2 cores (repeat 1's runs measured; "
            "`--dry-run` gives the time from the runs recorded)."
        )

    def _cpu_text(self) -> str:
        if self.cpu_cores_per_device is not None:
            return f"{self.cpu_cores_per_device:g} CPU cores per device"
        return f"the fleet shares {FLEET_CPU_CORES:g} CPU cores evenly (2 / N per device)"

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "device_counts": list(self.device_counts),
            "codecs": list(self.codecs),
            "sites": list(self.sites),
            "link": self.link,
            "cpu_cores_per_device": self.cpu_cores_per_device,
            "fleet_cpu_cores": FLEET_CPU_CORES,
            "epochs": self.epochs,
            "max_steps_per_epoch": self.max_steps_per_epoch,
            "workload": self.workload.name,
            "target_accuracy": self.workload.target_accuracy,
            "batch_size": self.batch_size,
        }
