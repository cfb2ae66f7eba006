"""What batch normalisation across ranks costs: synchronised statistics against averaged ones.

Two ways to keep a batch-normalised model identical on every rank, measured side by side:

* `local` (globaldl's choice): each rank normalises with its own batch statistics; the moving
  statistics are averaged by one fused allreduce at every epoch end, elastic commit,
  checkpoint, validation and before the final digest (`Trainer.synchronise_local_statistics`).
  No collective is added to the step.
* `sync`: Horovod's `SyncBatchNormalization` averages each layer's batch mean and variance
  over the ranks in the forward pass (one allreduce per layer) and its gradient in the
  backward pass (one more): 2 x layers collectives per step, each waiting for the previous one.

Why globaldl chose `local`: the product trains over slow, high-latency links, where the number
of collectives per step decides the step time (that is why the gradients travel in one fused
collective). `sync` would add 18 sequential collectives per step to ResNet-8 and 42 to
ResNet-20; `local` adds none, and its one collective per epoch or commit makes the ranks
identical. Averaging the moving statistics changed validation accuracy by under a point (4
ranks of ResNet-8, README); what `sync` would change, normalising over the global batch
instead of each device's 16 examples, matters with tiny local batches on a fast network,
where `--batch-norm sync` remains available.

Every collective is negotiated by Horovod's coordinator, which works in cycles of
`HOROVOD_CYCLE_TIME`, and on a real link costs at least one round trip; the fleet runs at
cycle times of 1-50 ms. The benchmark launches real `horovodrun` on this machine (loopback,
no latency) for each cycle time, times the training step of each variant (ResNet-8 and
ResNet-20, cifar-synthetic), counts the collectives in the traced step, and times one
averaging of the moving statistics. From the counts it also states the least a link with a
given round trip adds per step (collectives x round trip). Repeats are interleaved (the
variants alternate inside a launch, the cycle times rotate between repeats); each figure is
the median with its min-max, and each launch records the CPU time that processes outside it
used meanwhile (the machine's load).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globaldl.bench.batchnorm_worker import RESNET_DEPTHS_BY_NAME

VARIANTS: tuple[str, ...] = ("local", "sync")
# A launch counts as taken on a busy machine when processes outside it used more than this
# share of the machine's CPU time meanwhile.
BUSY_OUTSIDE_CPU_SHARE = 0.10
LAUNCH_TIMEOUT_SECONDS = 1800


@dataclass(frozen=True)
class BatchNormBench:
    """What to measure: ranks, models, cycle times, steps, repeats, the round trip projected."""

    ranks: int = 2
    models: tuple[str, ...] = ("resnet-8", "resnet-20")
    cycle_times_ms: tuple[float, ...] = (1.0, 5.0, 20.0)
    steps: int = 30
    warmup_steps: int = 3
    averagings: int = 5
    repeats: int = 3
    batch_size: int = 16
    round_trip_ms: float = 100.0
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "cycle_times_ms", tuple(float(c) for c in self.cycle_times_ms))
        for name, value, minimum in (
            ("ranks", self.ranks, 2),
            ("steps", self.steps, 1),
            ("warmup_steps", self.warmup_steps, 1),
            ("averagings", self.averagings, 1),
            ("repeats", self.repeats, 1),
            ("batch_size", self.batch_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(
                    f"{name} {value!r} is not allowed; use a whole number >= {minimum}"
                )
        unknown = [model for model in self.models if model not in RESNET_DEPTHS_BY_NAME]
        if unknown or not self.models:
            raise ValueError(
                f"models {list(self.models)!r} are not allowed; choose from "
                f"{', '.join(RESNET_DEPTHS_BY_NAME)}"
            )
        if not self.cycle_times_ms or any(not c > 0 for c in self.cycle_times_ms):
            raise ValueError(
                f"cycle times {list(self.cycle_times_ms)!r} are not allowed; use milliseconds > 0"
            )
        if not self.round_trip_ms > 0:
            raise ValueError(f"round_trip_ms {self.round_trip_ms!r} is not allowed; use > 0")

    def command(self) -> str:
        """The `globaldl bench batchnorm` command line that measures this."""
        return (
            f"globaldl bench batchnorm --ranks {self.ranks} --models {','.join(self.models)} "
            f"--cycle-times-ms {','.join(f'{c:g}' for c in self.cycle_times_ms)} "
            f"--steps {self.steps} --repeats {self.repeats} --batch-size {self.batch_size} "
            f"--round-trip-ms {self.round_trip_ms:g}"
        )


def _busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch_order(bench: BatchNormBench, repeat: int) -> list[str]:
    """model:variant pairs of one launch; the variants' order alternates between repeats."""
    variants = VARIANTS if repeat % 2 == 0 else tuple(reversed(VARIANTS))
    return [f"{model}:{variant}" for model in bench.models for variant in variants]


def cycle_order(bench: BatchNormBench, repeat: int) -> list[float]:
    """The cycle times of one repeat, rotated so no cycle time always runs first."""
    shift = repeat % len(bench.cycle_times_ms)
    return [*bench.cycle_times_ms[shift:], *bench.cycle_times_ms[:shift]]


def _launch(
    bench: BatchNormBench, cycle_time_ms: float, repeat: int, scratch: Path
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One horovodrun launch at one cycle time; its rows and the machine's load meanwhile."""
    bin_dir = Path(sys.executable).parent
    out = scratch / f"launch-{repeat}-{cycle_time_ms:g}.json"
    command = [
        str(bin_dir / "horovodrun"),
        "-np",
        str(bench.ranks),
        "-H",
        f"localhost:{bench.ranks}",
        "--gloo",
        sys.executable,
        "-m",
        "globaldl.bench.batchnorm_worker",
        "--out",
        str(out),
        "--order",
        ",".join(launch_order(bench, repeat)),
        "--steps",
        str(bench.steps),
        "--warmup-steps",
        str(bench.warmup_steps),
        "--averagings",
        str(bench.averagings),
        "--batch-size",
        str(bench.batch_size),
    ]
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "HOROVOD_CYCLE_TIME": f"{cycle_time_ms:g}",
        **bench.extra_env,
    }
    busy, children, started = _busy_cpu_seconds(), _children_cpu_seconds(), time.monotonic()
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_SECONDS
    )
    wall = time.monotonic() - started
    own = _children_cpu_seconds() - children
    outside = max(0.0, _busy_cpu_seconds() - busy - own)
    if completed.returncode != 0:
        raise RuntimeError(
            f"horovodrun exited {completed.returncode} at HOROVOD_CYCLE_TIME={cycle_time_ms:g}:\n"
            f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
        )
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        row.update(cycle_time_ms=cycle_time_ms, repeat=repeat)
    load = {
        "wall_seconds": wall,
        "own_cpu_seconds": own,
        "outside_cpu_seconds": outside,
        "outside_cpu_share": outside / max(wall * (os.cpu_count() or 1), 1e-9),
    }
    return rows, load


def run_bench(
    bench: BatchNormBench, progress: Callable[[str], None] = print
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every launch of every repeat; returns the per-launch rows and the launches' load records."""
    measured: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="globaldl-bench-bn-") as scratch:
        for repeat in range(bench.repeats):
            for cycle_time_ms in cycle_order(bench, repeat):
                rows, load = _launch(bench, cycle_time_ms, repeat, Path(scratch))
                measured += rows
                loads.append({"repeat": repeat, "cycle_time_ms": cycle_time_ms, **load})
                progress(
                    f"repeat {repeat + 1}/{bench.repeats}, cycle {cycle_time_ms:g} ms: "
                    + ", ".join(
                        f"{r['model']} {r['variant']} {1000 * r['step_seconds']:.0f} ms"
                        for r in rows
                    )
                    + f" (outside CPU {100 * load['outside_cpu_share']:.0f}%)"
                )
    return measured, loads


def summarise(
    bench: BatchNormBench, measured: Sequence[dict[str, Any]], loads: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per model, cycle time and variant: medians with min-max over the repeats."""
    rows = []
    for model in bench.models:
        for cycle_time_ms in bench.cycle_times_ms:
            cycle_loads = [load for load in loads if load["cycle_time_ms"] == cycle_time_ms]
            by_variant = {
                variant: [
                    m
                    for m in measured
                    if m["model"] == model
                    and m["variant"] == variant
                    and m["cycle_time_ms"] == cycle_time_ms
                ]
                for variant in VARIANTS
            }
            local_median = statistics.median(m["step_seconds"] for m in by_variant["local"])
            local_collectives = by_variant["local"][0]["collectives_per_step"]
            for variant, runs in by_variant.items():
                steps_ms = [1000 * m["step_seconds"] for m in runs]
                averaging_ms = [1000 * m["averaging_seconds"] for m in runs]
                median_ms = statistics.median(steps_ms)
                extra = runs[0]["collectives_per_step"] - local_collectives
                rows.append(
                    {
                        "model": model,
                        "variant": variant,
                        "ranks": bench.ranks,
                        "cycle_time_ms": cycle_time_ms,
                        "batch_norm_layers": runs[0]["batch_norm_layers"],
                        "collectives_per_step": runs[0]["collectives_per_step"],
                        "extra_collectives_per_step": extra,
                        "step_ms_median": median_ms,
                        "step_ms_min": min(steps_ms),
                        "step_ms_max": max(steps_ms),
                        "step_vs_local": median_ms / (1000 * local_median),
                        "averaging_ms_median": statistics.median(averaging_ms),
                        "averaging_collectives": runs[0]["averaging_collectives"],
                        f"least_added_ms_per_step_at_{bench.round_trip_ms:g}ms_round_trip": extra
                        * bench.round_trip_ms,
                        "repeats": len(runs),
                        "outside_cpu_share_max": max(
                            load["outside_cpu_share"] for load in cycle_loads
                        ),
                    }
                )
    return rows


def notes(bench: BatchNormBench, rows: Sequence[dict[str, Any]]) -> str:
    """The markdown under the table: what the columns mean, the load, and the choice."""
    busy = [row for row in rows if row["outside_cpu_share_max"] > BUSY_OUTSIDE_CPU_SHARE]
    per_model = []
    for model in bench.models:
        sync_rows = [r for r in rows if r["model"] == model and r["variant"] == "sync"]
        local_rows = [r for r in rows if r["model"] == model and r["variant"] == "local"]
        ratios = [r["step_vs_local"] for r in sync_rows]
        extra = sync_rows[0]["extra_collectives_per_step"]
        per_model.append(
            f"- {model}: `sync` adds {extra} collectives per step "
            f"({sync_rows[0]['batch_norm_layers']} normalisation layers x 2), at a "
            f"{bench.round_trip_ms:g} ms round trip at least {extra * bench.round_trip_ms:g} ms "
            f"per step; its step took {min(ratios):.2f}-{max(ratios):.2f}x the `local` step "
            "here, where no collective pays link latency. `local` adds none to the step; its "
            f"averaging ({max(r['averaging_ms_median'] for r in local_rows):.0f} ms at most, "
            f"{local_rows[0]['averaging_collectives']} collective) runs once per epoch or commit."
        )
    lines = [
        f"{bench.ranks} ranks on this machine (loopback: no link latency), local batch "
        f"{bench.batch_size}, cifar-synthetic; per launch {bench.warmup_steps} untimed steps, "
        f"then {bench.steps} timed steps per variant; {bench.repeats} interleaved repeats, "
        "medians with min-max over them.",
        "",
        "- `collectives_per_step`: Horovod collective ops in the traced training step (the "
        "gradient exchange, plus for `sync` one allreduce per batch-normalisation layer forward "
        "and one backward). They run one after another: each waits for the layer before it.",
        "- `averaging_ms_median`, `averaging_collectives`: one averaging of every moving "
        "statistic (`local` does it at epoch ends, commits, checkpoints, validation and the "
        "final digest; never per step).",
        f"- `least_added_ms_per_step_at_{bench.round_trip_ms:g}ms_round_trip`: extra "
        "collectives per step x the round trip; a lower bound (a ring allreduce over N devices "
        "takes 2(N-1) message hops, and Horovod negotiates each collective first).",
        f"- `outside_cpu_share_max`: CPU time used by processes outside the launch, as a share "
        f"of the machine's, worst launch; above {BUSY_OUTSIDE_CPU_SHARE:.0%} the row was taken "
        "on a busy machine.",
        "",
        (
            f"**Busy machine**: {len(busy)} of {len(rows)} rows had more than "
            f"{BUSY_OUTSIDE_CPU_SHARE:.0%} outside CPU; re-run on a quiet machine."
            if busy
            else "The machine was quiet in every launch."
        ),
        "",
        "Measured:",
        *per_model,
        "",
        "Choice: `local` (the default, `--batch-norm local`): no collective per step, and after "
        "every averaging all ranks hold the same statistics, so every rank ends identical. "
        "`--batch-norm sync` stays available for fast local networks with tiny local batches.",
    ]
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Step time against the cycle time, per model and variant, with min-max bars."""
    from globaldl.experiments.outputs import save_figure

    models = list(dict.fromkeys(row["model"] for row in rows))

    def draw(figure: Any) -> None:
        axes = figure.subplots(1, len(models), squeeze=False)[0]
        for ax, model in zip(axes, models, strict=True):
            for variant, marker in zip(VARIANTS, ("o", "s"), strict=True):
                chosen = [r for r in rows if r["model"] == model and r["variant"] == variant]
                x = [r["cycle_time_ms"] for r in chosen]
                y = [r["step_ms_median"] for r in chosen]
                error = [
                    [r["step_ms_median"] - r["step_ms_min"] for r in chosen],
                    [r["step_ms_max"] - r["step_ms_median"] for r in chosen],
                ]
                ax.errorbar(x, y, yerr=error, marker=marker, capsize=3, label=variant)
            ax.set_xscale("log")
            ax.set_xlabel("HOROVOD_CYCLE_TIME (ms)")
            ax.set_ylabel("training step (ms), median and min-max")
            ax.set_title(model)
            ax.legend(title="batch norm")

    return save_figure(path, draw, width_inches=4.0 * len(models) + 1.0)


def run_and_write(
    bench: BatchNormBench, out_dir: Path, progress: Callable[[str], None] = print
) -> list[Path]:
    """Measure, then write batchnorm.json, batchnorm.md and batchnorm.png into `out_dir`."""
    from globaldl.bench.results import write_results

    measured, loads = run_bench(bench, progress)
    rows = summarise(bench, measured, loads)
    png = plot(rows, Path(out_dir) / "batchnorm.png")
    json_path, md_path = write_results(
        out_dir,
        "batchnorm",
        "Batch normalisation across ranks: synchronised against averaged statistics",
        rows,
        notes=notes(bench, rows) + f"\n\n![step time]({png.name})\n",
        command=bench.command(),
        extra={"launches": loads, "measured": list(measured)},
    )
    return [json_path, md_path, png]
