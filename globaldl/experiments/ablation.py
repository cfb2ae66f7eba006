"""`ablation`: each compression step alone and together, on a 5 Mbit/s uplink and unshaped.

The default variants are the ones the goals need (issue 10, section 3): the two baselines
(`none`, Horovod's `fp16`), each step alone (`prune`, `quantize`) and together, the recommended
preset at Horovod's default cycle time (does the automatic cycle time pay?) and both the
recommended preset and `none` on an unshaped link (what the network costs, and what the codec
costs without one). Left out of the default since the protocol runs each variant 3 times
(about 70 minutes instead of 2 hours for the 11 variants): `prune0.001+sign` (never reaches the
target, no goal reads it), `prune+quantize (cycle 20 ms)` and `none (cycle 1 ms)` (cycle-time
studies beside the compression question; `none (cycle 1 ms)` alone costs ~8 minutes a repeat).
`--variants` brings any of them back (ALL_VARIANTS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globaldl.experiments.aggregate import error_bars, representative_results, row_spread
from globaldl.experiments.analysis import (
    TargetCheck,
    at_least_times_sooner,
    at_most_times,
    epoch_end_seconds,
    seconds_or_not_reached,
    time_to_target,
)
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import save_figure
from globaldl.experiments.runner import RunResult
from globaldl.experiments.spec import (
    LENET_MNIST,
    FleetConfig,
    RunSpec,
    Workload,
    compression_args,
    slug,
)
from globaldl.fleet.cycle_time import HOROVOD_DEFAULT_CYCLE_TIME_MS, auto_cycle_time_ms
from globaldl.monitoring.phases import phase_shares

SHAPED_UP_MBIT, SHAPED_DOWN_MBIT = 5, 20
# "Unshaped": a rate far above anything the emulated devices can push (tbf still counts it).
UNSHAPED_MBIT = 10000
RECOMMENDED = "prune+quantize"


@dataclass(frozen=True)
class Variant:
    """One ablation run: a compression preset on the shaped or the unshaped link.

    `cycle_time_ms` pins HOROVOD_CYCLE_TIME (e.g. Horovod's own 1 ms) instead of the link's
    automatic choice, to measure what the cycle time does.
    """

    compression: str
    shaped: bool = True
    cycle_time_ms: float | None = None

    @property
    def name(self) -> str:
        """e.g. `prune+quantize`, `prune+quantize (unshaped)`, `none (cycle 1 ms)`."""
        suffix = []
        if not self.shaped:
            suffix.append("unshaped")
        if self.cycle_time_ms is not None:
            suffix.append(f"cycle {self.cycle_time_ms:g} ms")
        return self.compression + (f" ({', '.join(suffix)})" if suffix else "")

    @property
    def label(self) -> str:
        """A folder name, e.g. `prune_quantize-unshaped`."""
        label = slug(self.compression)
        if not self.shaped:
            label += "-unshaped"
        if self.cycle_time_ms is not None:
            label += f"-cycle{self.cycle_time_ms:g}ms"
        return label


DEFAULT_CYCLE = HOROVOD_DEFAULT_CYCLE_TIME_MS
# Every variant the ablation knows (the committed results before the protocol ran all 11).
ALL_VARIANTS: tuple[Variant, ...] = (
    Variant("none"),
    Variant("fp16"),
    Variant("prune"),
    Variant("quantize"),
    Variant(RECOMMENDED),
    Variant("prune0.001+sign"),
    Variant(RECOMMENDED, cycle_time_ms=DEFAULT_CYCLE),
    Variant(RECOMMENDED, cycle_time_ms=20.0),
    Variant("none", cycle_time_ms=DEFAULT_CYCLE),
    Variant(RECOMMENDED, shaped=False),
    Variant("none", shaped=False),
)
# What the goals need (see the module docstring for what is left out and why).
FULL_VARIANTS: tuple[Variant, ...] = (
    Variant("none"),
    Variant("fp16"),
    Variant("prune"),
    Variant("quantize"),
    Variant(RECOMMENDED),
    Variant(RECOMMENDED, cycle_time_ms=DEFAULT_CYCLE),
    Variant(RECOMMENDED, shaped=False),
    Variant("none", shaped=False),
)
QUICK_VARIANTS: tuple[Variant, ...] = (
    Variant("none"),
    Variant("fp16"),
    Variant(RECOMMENDED),
    Variant(RECOMMENDED, cycle_time_ms=DEFAULT_CYCLE),
    Variant(RECOMMENDED, shaped=False),
)


def variants_by_label(labels: Sequence[str]) -> tuple[Variant, ...]:
    """The variants of ALL_VARIANTS with these labels; ValueError naming the known ones."""
    known = {variant.label: variant for variant in ALL_VARIANTS}
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(
            f"ablation variant(s) {', '.join(unknown)} unknown; choose from: {', '.join(known)}"
        )
    return tuple(known[label] for label in labels)


class AblationExperiment(Experiment):
    """Which compression step buys what, where the uplink is the constraint.

    Four devices on a 5 Mbit/s up / 20 Mbit/s down link train LeNet on MNIST with each
    compression preset; the recommended preset (and the uncompressed baseline) also run on an
    unshaped link, and at pinned cycle times (Horovod's default 1 ms, and 20 ms).
    """

    name = "ablation"
    title = "Compression ablation on a 5 Mbit/s uplink"
    columns = (
        "variant",
        "profile",
        "horovod_cycle_time_ms",
        "epochs",
        "val_accuracy",
        "seconds_to_target",
        "mean_step_seconds",
        "exchange_share",
        "wire_bytes_per_step",
        "compression_ratio",
        "device_tx_bytes_per_step",
        "traffic_ratio_vs_dense_measured",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        variants: Sequence[Variant] | None = None,
        devices: int = 4,
        cpu_cores_per_device: float = 0.5,
        workload: Workload = LENET_MNIST,
        epochs: int | None = None,
        max_steps_per_epoch: int | None = None,
        batch_size: int = 16,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.variants = tuple(variants or (QUICK_VARIANTS if quick else FULL_VARIANTS))
        for variant in self.variants:
            compression_args(variant.compression)
        names = [variant.name for variant in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"ablation variants repeat: {names}")
        self.devices = devices
        self.cpu_cores_per_device = cpu_cores_per_device
        self.workload = workload
        self.epochs = epochs or (2 if quick else 8)
        self.max_steps_per_epoch = max_steps_per_epoch or (12 if quick else None)
        self.batch_size = batch_size
        self.shaped_profile = f"custom:{SHAPED_UP_MBIT}:{SHAPED_DOWN_MBIT}"
        self.unshaped_profile = f"custom:{UNSHAPED_MBIT}:{UNSHAPED_MBIT}"
        # The shaped link's cycle time, used on the unshaped link too: only the link differs.
        self.link_cycle_time_ms = cycle_time_ms or auto_cycle_time_ms(
            SHAPED_UP_MBIT * 1000, SHAPED_DOWN_MBIT * 1000
        )

    def plan(self) -> list[RunSpec]:
        """Shaped runs on one fleet, then unshaped runs on another."""
        specs = []
        for shaped in (True, False):
            profile = self.shaped_profile if shaped else self.unshaped_profile
            fleet = FleetConfig(self.devices, profile, self.cpu_cores_per_device)
            for variant in (v for v in self.variants if v.shaped == shaped):
                args = [
                    *self.workload.train_args,
                    "--batch-size",
                    str(self.batch_size),
                    "--epochs",
                    str(self.epochs),
                ]
                if self.max_steps_per_epoch is not None:
                    args += ["--max-steps-per-epoch", str(self.max_steps_per_epoch)]
                args += [*compression_args(variant.compression), "--seed", "0"]
                specs.append(
                    RunSpec(
                        experiment=self.name,
                        label=variant.label,
                        fleet=fleet,
                        train_args=tuple(args),
                        factors={"variant": variant.name, "compression": variant.compression},
                        cycle_time_ms=variant.cycle_time_ms or self.link_cycle_time_ms,
                    )
                )
        return specs

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run, with time to the target and the exchange's share of the step."""
        rows = []
        for result in results:
            row = run_row(result)
            row["target_accuracy"] = self.workload.target_accuracy
            if result.summary is not None:
                row["seconds_to_target"] = seconds_or_not_reached(
                    time_to_target(result.summary.get("history", []), self.workload.target_accuracy)
                )
                if sum(result.summary["phase_seconds"].values()) > 0:
                    row["exchange_share"] = phase_shares(result.summary["phase_seconds"])[
                        "exchange"
                    ]
            rows.append(row)
        return rows

    @staticmethod
    def _by_variant(rows: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
        return next((row for row in rows if row.get("variant") == name), {})

    def _variant_of(self, row: dict[str, Any]) -> Variant | None:
        """The variant a table row measured (also for results of variants since dropped)."""
        known = {variant.label: variant for variant in (*ALL_VARIANTS, *self.variants)}
        return known.get(str(row.get("label")))

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """The ablation's goals, on the medians of the repeats: met, not met or not evaluated.

        prune+quantize reaches the target >= 10x sooner than none and >= 5x sooner than fp16;
        its step on the shaped link is <= 1.5x the unshaped one; the automatic cycle time
        steps no slower than each pinned one measured.
        """
        target = self.workload.target_accuracy
        recommended = self._by_variant(rows, RECOMMENDED)
        measured = {row.get("variant") for row in rows}
        checks = []
        for baseline, factor in (("none", 10.0), ("fp16", 5.0)):
            if baseline not in measured and rows:
                continue
            baseline_row = self._by_variant(rows, baseline)
            checks.append(
                at_least_times_sooner(
                    f"{RECOMMENDED} reaches val_accuracy {target:g} >= {factor:g}x sooner than "
                    f"{baseline} ({self.shaped_profile})",
                    row_spread(recommended, "seconds_to_target"),
                    row_spread(baseline_row, "seconds_to_target"),
                    factor,
                    slower_total_seconds=row_spread(baseline_row, "training_seconds"),
                )
            )
        unshaped = self._by_variant(rows, Variant(RECOMMENDED, shaped=False).name)
        if unshaped or not rows:
            checks.append(
                at_most_times(
                    f"{RECOMMENDED} mean step time on {self.shaped_profile} <= 1.5x the unshaped "
                    "link's",
                    row_spread(recommended, "mean_step_seconds"),
                    row_spread(unshaped, "mean_step_seconds"),
                    1.5,
                )
            )
        # What the automatic cycle time buys against each pinned one, compression alike.
        for row in rows:
            variant = self._variant_of(row)
            if variant is None or variant.cycle_time_ms is None or not variant.shaped:
                continue
            automatic = self._by_variant(rows, Variant(variant.compression).name)
            automatic_ms = automatic.get("horovod_cycle_time_ms", self.link_cycle_time_ms)
            checks.append(
                at_most_times(
                    f"{variant.compression} at the automatic HOROVOD_CYCLE_TIME "
                    f"({automatic_ms:g} ms) steps no slower than at "
                    f"{variant.cycle_time_ms:g} ms ({self.shaped_profile})",
                    row_spread(automatic, "mean_step_seconds"),
                    row_spread(row, "mean_step_seconds"),
                    1.0,
                )
            )
        return checks

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """ablation.png: accuracy against time per variant, and the mean step time."""
        target = self.workload.target_accuracy

        def draw(figure: Any) -> None:
            from matplotlib import colormaps
            from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

            curve_axis, step_axis = figure.subplots(1, 2)
            # More variants than the default colour cycle has colours: tab20, and an open
            # marker for the unshaped runs.
            colours = iter(colormaps["tab20"].colors)
            for result in representative_results(results):
                if result.summary is None or not result.summary.get("history"):
                    continue
                history = result.summary["history"]
                variant = str(result.spec.factors["variant"])
                curve_axis.plot(
                    epoch_end_seconds(history),
                    [epoch["val_accuracy"] for epoch in history],
                    marker="o",
                    markerfacecolor="none" if "unshaped" in variant else None,
                    color=next(colours, None),
                    label=variant,
                )
            curve_axis.axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
            curve_axis.set_xscale("log")
            curve_axis.set_xlabel("seconds since the first step (the median repeat)")
            curve_axis.set_ylabel("validation accuracy")
            curve_axis.legend(fontsize=6)
            curve_axis.grid(alpha=0.3)
            plotted = [
                (str(row["variant"]), spread)
                for row in rows
                if (spread := row_spread(row, "mean_step_seconds")) is not None
            ]
            step_axis.barh(
                [name for name, _ in plotted],
                [spread.median for _, spread in plotted],
                xerr=error_bars([spread for _, spread in plotted]),
                color="tab:orange",
                ecolor="black",
                capsize=2,
            )
            step_axis.set_xscale("log")
            step_axis.set_xlabel("mean step seconds (rank 0): median, min-max")
            step_axis.tick_params(axis="y", labelsize=7)
            step_axis.grid(axis="x", alpha=0.3)
            for axis in (curve_axis, step_axis):
                # Plain numbers on the log axes (1, 2, 5 x 10^k), no minor-tick labels.
                axis.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                axis.xaxis.set_major_formatter(ScalarFormatter())
                axis.xaxis.set_minor_formatter(NullFormatter())
            figure.suptitle(
                f"{self.workload.name}, {self.devices} devices x {self.cpu_cores_per_device:g} "
                f"cores, {self.shaped_profile} unless unshaped",
                fontsize=9,
            )

        return [save_figure(out_dir / "ablation.png", draw, width_inches=12, height_inches=4.5)]

    def extra_markdown(self, results: Sequence[RunResult]) -> str:
        """Per-step speed-up of every variant against the two baselines, with its range."""
        rows = self.aggregate(self.rows(results))
        baselines = {
            name: row_spread(self._by_variant(rows, name), "mean_step_seconds")
            for name in ("none", "fp16")
        }
        lines = []
        for row in rows:
            step = row_spread(row, "mean_step_seconds")
            if step is None or not row.get("variant"):
                continue
            cells = [
                "" if baseline is None else baseline.ratio_to(step).text("x", digits=2)
                for baseline in baselines.values()
            ]
            lines.append(f"| {row['variant']} | {step.text(' s')} | " + " | ".join(cells) + " |")
        if not lines or all(baseline is None for baseline in baselines.values()):
            return ""
        return (
            "## Per-step speed-up against the baselines\n\n"
            "Mean step time (rank 0) of each variant, and how many times faster it steps than "
            "`none` and `fp16`: the ratio of the medians, in brackets the widest ratio the "
            "min-max of both allow (a range that contains 1 cannot tell the two apart).\n\n"
            "| variant | mean step | vs none | vs fp16 |\n|---|---|---|---|\n" + "\n".join(lines)
        )

    def method(self) -> str:
        """How the runs are built."""
        presets = "; ".join(
            f"`{v.name}`: `{' '.join(compression_args(v.compression)) or '(no flags)'}`"
            for v in self.variants
        )
        return (
            f"{self.workload.name} (`{' '.join(self.workload.train_args)}`), {self.devices} "
            f"devices x {self.cpu_cores_per_device:g} cores, local batch {self.batch_size}, "
            f"{self.epochs} epochs"
            + (
                f" of {self.max_steps_per_epoch} steps per device"
                if self.max_steps_per_epoch
                else ""
            )
            + f". Shaped link `{self.shaped_profile}` (5 Mbit/s up, 20 Mbit/s down); unshaped "
            f"link `{self.unshaped_profile}`. HOROVOD_CYCLE_TIME {self.link_cycle_time_ms:g} ms "
            "on both links (the shaped link's automatic choice), except the variants marked "
            f"`cycle N ms` (Horovod's default is {HOROVOD_DEFAULT_CYCLE_TIME_MS:g} ms). "
            f"Variants: {presets}. `fp16` is the "
            "equivalent of Horovod's only built-in compression. The byte columns are defined "
            "under the links below. Target accuracy "
            f"{self.workload.target_accuracy:g}; the goal that time to accuracy falls from 1 to "
            "8 devices with compression on is checked by the `devices` experiment."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "variants": [v.name for v in self.variants],
            "devices": self.devices,
            "cpu_cores_per_device": self.cpu_cores_per_device,
            "workload": self.workload.name,
            "target_accuracy": self.workload.target_accuracy,
            "epochs": self.epochs,
            "max_steps_per_epoch": self.max_steps_per_epoch,
            "batch_size": self.batch_size,
            "link_cycle_time_ms": self.link_cycle_time_ms,
        }
