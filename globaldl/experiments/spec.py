"""What one experiment run is: the fleet it needs, its `globaldl train` arguments, its factors."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from globaldl.settings import TrainSettings

# A run id and a folder name: the characters TrainingMetrics accepts in a run id.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(text: str) -> str:
    """`text` reduced to letters, digits, `_`, `.` and `-` (usable as a run id and a file name)."""
    cleaned = _UNSAFE.sub("_", text).strip("_.-")
    if not cleaned:
        raise ValueError(f"{text!r} has no letters or digits to build a name from")
    return cleaned


@dataclass(frozen=True)
class FleetConfig:
    """The emulated fleet a run needs: devices, one link profile for all, limits per device.

    `profile` is what `globaldl fleet up --profile` takes: a name from the profiles file or
    `custom:UP_MBIT:DOWN_MBIT[:ONE_WAY_DELAY_MS]`. With `sites` (e.g. "4x4"), the devices sit
    in sites: `profile` is then each site's shared WAN link and `lan` each device's link to
    its site. Runs with equal configs share one `fleet up`.
    """

    devices: int
    profile: str
    cpu_cores_per_device: float
    memory_mb: int | None = None
    cpu_cores_each: tuple[float, ...] | None = None  # one per device; overrides the above
    sites: str | None = None
    lan: str | None = None

    def __post_init__(self) -> None:
        if self.cpu_cores_each is not None:
            object.__setattr__(self, "cpu_cores_each", tuple(self.cpu_cores_each))
            if len(self.cpu_cores_each) != self.devices:
                raise ValueError(
                    f"cpu_cores_each needs {self.devices} values, got {self.cpu_cores_each!r}"
                )
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError(f"devices must be a whole number >= 1, got {self.devices!r}")
        if not self.profile:
            raise ValueError("profile must not be empty")
        if not self.cpu_cores_per_device > 0:
            raise ValueError(f"cpu_cores_per_device must be > 0, got {self.cpu_cores_per_device!r}")
        if self.lan is not None and self.sites is None:
            raise ValueError(f"lan {self.lan!r} describes sites; it needs sites")

    @property
    def cpu_cores_total(self) -> float:
        """CPU cores of the whole fleet."""
        if self.cpu_cores_each is not None:
            return sum(self.cpu_cores_each)
        return self.devices * self.cpu_cores_per_device

    def up_command(self, *, prefix: str, subnet: str, state_dir: str) -> str:
        """The equivalent `globaldl fleet up` command line."""
        links = (
            [f"--profile {self.profile}"]
            if self.sites is None
            else [f"--sites {self.sites}", f"--lan {self.lan or 'lan'}", f"--wan {self.profile}"]
        )
        parts = [
            "globaldl fleet up",
            f"-n {self.devices}",
            *links,
            (
                f"--cpu {self.cpu_cores_per_device:g}"
                if self.cpu_cores_each is None
                else "--cpu-each " + ",".join(f"{value:g}" for value in self.cpu_cores_each)
            ),
        ]
        if self.memory_mb is not None:
            parts.append(f"--memory {self.memory_mb}")
        parts += [f"--prefix {prefix}", f"--subnet {subnet}", f"--state-dir {state_dir}"]
        return " ".join(parts)

    def get_config(self) -> dict[str, Any]:
        """Plain-data form; `FleetConfig(**c.get_config()) == c`."""
        return {
            "devices": self.devices,
            "profile": self.profile,
            "cpu_cores_per_device": self.cpu_cores_per_device,
            "memory_mb": self.memory_mb,
            "cpu_cores_each": list(self.cpu_cores_each) if self.cpu_cores_each else None,
            "sites": self.sites,
            "lan": self.lan,
        }


FAULT_ACTIONS: tuple[str, ...] = ("kill", "revive", "measure")


@dataclass(frozen=True)
class Fault:
    """Something done to one device while a run goes on: `fleet kill`, `revive` or `measure`.

    `measure` probes the device's path to the core (round trip, loss, rate) and records the
    result with the fault. A fault fires `delay_seconds` after the first line of the run's
    output (read in order, after the previous fault's trigger) that matches `after_line`.
    """

    action: str
    device: int  # 1-based: device PREFIX-<device> of the fleet
    after_line: str
    delay_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.action not in FAULT_ACTIONS:
            raise ValueError(
                f"fault action {self.action!r} is not one of: {', '.join(FAULT_ACTIONS)}"
            )
        if isinstance(self.device, bool) or not isinstance(self.device, int) or self.device < 1:
            raise ValueError(f"fault device must be a device number >= 1, got {self.device!r}")
        if not self.delay_seconds >= 0:
            raise ValueError(f"fault delay must be >= 0 s, got {self.delay_seconds!r}")


@dataclass(frozen=True)
class RunSpec:
    """One training run of an experiment, decided before anything runs.

    Attributes:
        experiment: the experiment's name (devices, resources, ablation, bottleneck).
        label: unique within the experiment; names the run's folder and its run id.
        fleet: the fleet the run needs.
        train_args: `globaldl train` arguments, without --run-id/--summary (the runner adds
            those, and --metrics-port when `scrape_metrics` is set).
        factors: what varies across the experiment (model, devices, compression, ...): the
            columns that identify a row in the tables.
        cycle_time_ms: HOROVOD_CYCLE_TIME for this run; None picks it from the link.
        scrape_metrics: serve each worker's exporter and scrape it during the run.
        timeout_seconds: stop the run after this long.
        fleet_run_args: extra `globaldl fleet run` options (e.g. `--elastic --min-np 2`).
        env: extra environment of the workers (e.g. HOROVOD_GLOO_TIMEOUT_SECONDS).
        faults: devices to kill or revive during the run, in order.

    """

    experiment: str
    label: str
    fleet: FleetConfig
    train_args: tuple[str, ...]
    factors: Mapping[str, Any] = field(default_factory=dict)
    cycle_time_ms: float | None = None
    scrape_metrics: bool = False
    timeout_seconds: float = 3600.0
    fleet_run_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    faults: tuple[Fault, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fleet_run_args", tuple(self.fleet_run_args))
        object.__setattr__(
            self,
            "faults",
            tuple(f if isinstance(f, Fault) else Fault(**f) for f in self.faults),
        )
        for fault in self.faults:
            if fault.device > self.fleet.devices:
                raise ValueError(
                    f"run {self.label}: fault on device {fault.device}, but the fleet has "
                    f"{self.fleet.devices} devices"
                )
        if slug(self.label) != self.label:
            raise ValueError(
                f"run label {self.label!r} must use only letters, digits, '_', '.' and '-'; "
                f"e.g. {slug(self.label)!r}"
            )
        if any(arg in ("--run-id", "--summary", "--metrics-port") for arg in self.train_args):
            raise ValueError(
                f"run {self.label}: train_args must not set --run-id, --summary or "
                "--metrics-port; the runner sets them"
            )
        if self.cycle_time_ms is not None and not self.cycle_time_ms > 0:
            raise ValueError(f"cycle_time_ms must be > 0 or None, got {self.cycle_time_ms!r}")
        if not self.timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be > 0, got {self.timeout_seconds!r}")

    def option(self, name: str) -> str | None:
        """The value of `--name` in the train arguments, or None."""
        args = list(self.train_args)
        for index, arg in enumerate(args[:-1]):
            if arg == name:
                return args[index + 1]
        return None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunSpec:
        """Inverse of `get_config`."""
        return cls(
            **{
                **config,
                "fleet": FleetConfig(**config["fleet"]),
                "train_args": tuple(config["train_args"]),
            }
        )

    def get_config(self) -> dict[str, Any]:
        """Plain-data form, for the results JSON; `RunSpec.from_config` reads it back."""
        return {
            "experiment": self.experiment,
            "label": self.label,
            "fleet": self.fleet.get_config(),
            "train_args": list(self.train_args),
            "factors": dict(self.factors),
            "cycle_time_ms": self.cycle_time_ms,
            "scrape_metrics": self.scrape_metrics,
            "timeout_seconds": self.timeout_seconds,
            "fleet_run_args": list(self.fleet_run_args),
            "env": dict(self.env),
            "faults": [dict(fault.__dict__) for fault in self.faults],
        }


TRAIN_LEARNING_RATE: float = TrainSettings.learning_rate
"""`globaldl train`'s learning rate for one rank (its `--learning-rate` default), which the
trainer multiplies by the number of ranks (Horovod's linear scaling, `--scale-lr`)."""


@dataclass(frozen=True)
class Workload:
    """A model on a dataset, and the validation accuracy that counts as "trained".

    `max_learning_rate`: the largest scaled learning rate the workload is known to learn with;
    a fleet whose linear scaling would exceed it trains at it instead (`learning_rate_args`).
    None: no cap.
    """

    name: str
    train_args: tuple[str, ...]
    target_accuracy: float
    max_learning_rate: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.target_accuracy <= 1:
            raise ValueError(
                f"workload {self.name}: target_accuracy must be in (0, 1], got "
                f"{self.target_accuracy!r}"
            )
        if self.max_learning_rate is not None and not 0 < self.max_learning_rate < math.inf:
            raise ValueError(
                f"workload {self.name}: max_learning_rate must be a positive number or None, "
                f"got {self.max_learning_rate!r}"
            )

    def with_target(self, target_accuracy: float) -> Workload:
        """The same workload with another target accuracy."""
        return dataclasses.replace(self, target_accuracy=target_accuracy)

    def learning_rate_args(self, devices: int) -> tuple[str, ...]:
        """Train arguments for `devices` ranks: none within the cap, else the cap itself.

        Within the cap the trainer's linear scaling applies; above it the fleet trains at the
        cap as a fixed rate (`--no-scale-lr --learning-rate CAP`).
        """
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices!r}")
        cap = self.max_learning_rate
        if cap is None or TRAIN_LEARNING_RATE * devices <= cap:
            return ()
        return ("--no-scale-lr", "--learning-rate", f"{cap:g}")

    def learning_rate_text(self) -> str:
        """How the runs' learning rate follows the number of devices N, for method texts."""
        scaled = f"learning rate {TRAIN_LEARNING_RATE:g} x N (Horovod's linear scaling)"
        if self.max_learning_rate is None:
            return scaled
        return f"{scaled}, at most {self.max_learning_rate:g}"


# 0.08: 8 devices at 0.01 x 8 reached 0.958 in `devices`. At 16 devices linear scaling gives
# 0.16 with momentum 0.9, and LeNet diverged there: the `sites` run of 2026-11-23 (both
# layouts, validation loss 10.7 after one epoch) and a one-process check at batch 256, which
# diverged at 0.16 with and without a warm-up epoch (README, sites).
LENET_MNIST = Workload(
    "lenet", ("--model", "lenet", "--dataset", "mnist"), 0.90, max_learning_rate=0.08
)
# The 0.5 target is a guess: LeNet reaches ~0.4+ on cifar-synthetic in 5 epochs (the pipelines'
# learnability test); chance is 0.1.
RESNET8_CIFAR = Workload(
    "resnet-8", ("--model", "resnet", "--depth", "8", "--dataset", "cifar-synthetic"), 0.50
)

# The two-step compression presets, as `globaldl train` arguments. `prune+quantize` is the
# recommended one; `fp16` is what Horovod itself ships (its fp16 compression).
COMPRESSION_PRESETS: dict[str, tuple[str, ...]] = {
    "none": (),
    "fp16": ("--quantize", "fp16"),
    "prune": ("--prune", "topk", "--density", "0.01"),
    "quantize": ("--quantize", "int8"),
    "prune+quantize": ("--prune", "topk", "--density", "0.01", "--quantize", "int8"),
    "prune0.001+sign": ("--prune", "topk", "--density", "0.001", "--quantize", "sign"),
    # Deep gradient compression (momentum correction, factor masking, clipping) at 1%, after
    # a 2-epoch density warm-up (25%, then 6.25%), then int8.
    "dgc+quantize": (
        "--prune",
        "dgc",
        "--density",
        "0.01",
        "--warmup-epochs",
        "2",
        "--quantize",
        "int8",
    ),
}


def compression_args(preset: str) -> tuple[str, ...]:
    """The train arguments of a compression preset; ValueError naming the presets otherwise."""
    try:
        return COMPRESSION_PRESETS[preset]
    except KeyError:
        raise ValueError(
            f"compression preset {preset!r} is not one of: {', '.join(COMPRESSION_PRESETS)}"
        ) from None
