"""Training settings: one typed, validated object built from flags, a YAML file and the environment.

Precedence is the one Horovod users know: a command-line flag beats the config file, which beats
a `GLOBALDL_<NAME>` environment variable, which beats the default. Settings are parsed and
validated here, once; nothing below the CLI reads flags or environment variables.

The compression settings are one `CompressionConfig` inside `TrainSettings.compression`: its
fields are settings like any other (flags, file keys and variables use their names), the
config validates them itself, and the trainer hands the object unchanged to the codec.
`momentum` and `seed` are shared: the one value goes to the optimizer and data order here and
to the codec there (DGC's momentum correction, the codecs' random draws).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from globaldl.compression.config import CompressionConfig
from globaldl.local_sgd.schedule import SyncInterval, refusals
from globaldl.sites import SiteMapError, load_site_map

ENV_PREFIX = "GLOBALDL_"

# Kept in sync with globaldl.models / globaldl.pipelines by a unit test; duplicated here so
# that `--help` and validation do not import TensorFlow. (The compression names come from the
# codec package's own config module, which imports no TensorFlow.)
MODEL_NAMES: tuple[str, ...] = ("lenet", "resnet", "mlp", "video")
RESNET_DEPTHS: tuple[int, ...] = (8, 14, 20, 32)
DATASET_NAMES: tuple[str, ...] = ("mnist", "digits", "cifar-synthetic", "moving-mnist")
OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adam")
BALANCE_NAMES: tuple[str, ...] = ("equal", "speed")
HIERARCHY_NAMES: tuple[str, ...] = ("none", "sites")
BATCH_NORM_NAMES: tuple[str, ...] = ("local", "sync")
LR_DECAY_NAMES: tuple[str, ...] = ("none", "cosine")


class SettingsError(ValueError):
    """A setting has a value that is not allowed; the message names the setting and the choices."""


@dataclass(frozen=True)
class TrainSettings:
    """Everything one `globaldl train` run needs, validated on construction."""

    model: str = "lenet"
    dataset: str = "mnist"
    depth: int = 20
    layers: int = 3
    width: int = 128
    # Batch normalisation: each rank's own batch statistics (moving statistics averaged at
    # epoch ends and commits), or Horovod's synchronised statistics (collectives every step).
    batch_norm: str = "local"
    epochs: int = 2
    batch_size: int = 16
    max_steps_per_epoch: int | None = None
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.9
    scale_lr: bool = True
    lr_warmup_epochs: int = 0
    lr_decay: str = "none"
    seed: int = 0
    data_dir: Path | None = None
    input_delay_ms: float = 0.0
    input_delay_rank: int | None = None  # None: every rank's pipeline sleeps
    checkpoint_dir: Path | None = None
    resume: bool = False
    summary: Path | None = None
    run_id: str | None = None
    # Compression (two steps: prune, then quantize), validated by the config itself.
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    # Monitoring.
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    metrics_certfile: Path | None = None
    metrics_keyfile: Path | None = None
    metrics_basic_auth_file: Path | None = None
    device: str | None = None
    # The exchange: flat, or summed site by site (a site map names the sites' hosts).
    hierarchy: str = "none"
    sites_file: Path | None = None
    # Work per device: equal local batches, or in proportion to measured speed.
    balance: str = "equal"
    # Elastic membership (Horovod Elastic): commit the training state every K steps.
    elastic: bool = False
    commit_every: int = 20
    # Fewer rounds (globaldl/local_sgd): local steps between exchanges of model deltas.
    sync_every: SyncInterval | str = SyncInterval(steps=1)
    overlap: bool = False
    outer_optimizer: str = "sgd"
    outer_lr: float = 1.0
    outer_momentum: float | None = None
    # Fault injection, for proving the NaN/Inf path across real ranks.
    inject_nan_step: int | None = None
    inject_nan_rank: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_choice("model", self.model, MODEL_NAMES)
        _check_choice("dataset", self.dataset, DATASET_NAMES)
        _check_choice("optimizer", self.optimizer, OPTIMIZER_NAMES)
        _check_choice("balance", self.balance, BALANCE_NAMES)
        _check_choice("hierarchy", self.hierarchy, HIERARCHY_NAMES)
        _check_choice("batch_norm", self.batch_norm, BATCH_NORM_NAMES)
        _check_choice("lr_decay", self.lr_decay, LR_DECAY_NAMES)
        _check_at_least("lr_warmup_epochs", self.lr_warmup_epochs, 0)
        if self.lr_warmup_epochs > self.epochs:
            raise SettingsError(
                f"lr_warmup_epochs {self.lr_warmup_epochs} is not allowed; use at most epochs "
                f"({self.epochs})"
            )
        try:
            object.__setattr__(self, "sync_every", SyncInterval.parse(self.sync_every))
        except ValueError as error:
            raise SettingsError(str(error)) from None
        if self.model == "resnet":
            _check_choice("depth", self.depth, RESNET_DEPTHS)
        _check_at_least("layers", self.layers, 1)
        _check_at_least("width", self.width, 1)
        _check_at_least("epochs", self.epochs, 1)
        _check_at_least("batch_size", self.batch_size, 1)
        if self.max_steps_per_epoch is not None:
            _check_at_least("max_steps_per_epoch", self.max_steps_per_epoch, 1)
        _check_positive_finite("learning_rate", self.learning_rate)
        if not 0.0 <= self.momentum < 1.0:
            raise SettingsError(f"momentum {self.momentum!r} is not allowed; use 0 <= momentum < 1")
        if not isinstance(self.compression, CompressionConfig):
            raise SettingsError(f"compression {self.compression!r} is not a CompressionConfig")
        for name in SHARED_FIELDS:
            if getattr(self, name) != getattr(self.compression, name):
                raise SettingsError(
                    f"{name} {getattr(self, name)!r} differs from the compression config's "
                    f"{getattr(self.compression, name)!r}; one value serves both "
                    "(resolve_settings passes it to each)"
                )
        if not (math.isfinite(self.input_delay_ms) and self.input_delay_ms >= 0):
            raise SettingsError(
                f"input_delay_ms {self.input_delay_ms!r} is not allowed; use a number >= 0"
            )
        if self.input_delay_rank is not None:
            _check_at_least("input_delay_rank", self.input_delay_rank, 0)
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise SettingsError(
                f"metrics_port {self.metrics_port!r} is not allowed; use a port in 1..65535"
            )
        if (self.metrics_certfile is None) != (self.metrics_keyfile is None):
            raise SettingsError("metrics_certfile and metrics_keyfile must be given together")
        self.metrics_basic_auth()  # a bad credentials file fails now, not on the first scrape
        if self.inject_nan_step is not None:
            _check_at_least("inject_nan_step", self.inject_nan_step, 0)
        _check_at_least("inject_nan_rank", self.inject_nan_rank, 0)
        _check_at_least("commit_every", self.commit_every, 1)
        if self.balance == "speed" and self.elastic:
            raise SettingsError(
                "balance 'speed' and elastic cannot be combined yet: the speeds are measured "
                "once, before training, for a fixed set of devices"
            )
        if self.balance == "speed" and self.batch_norm == "sync":
            raise SettingsError(
                "balance 'speed' and batch_norm 'sync' cannot be combined: the speed probe runs "
                "the model alone on each rank, and synchronised statistics weight every rank "
                "equally whatever its batch"
            )
        if self.balance == "speed" and self.data_dir is not None:
            raise SettingsError(
                "balance 'speed' needs the in-memory dataset (shards sized by speed); drop data_dir"
            )
        if self.elastic and self.resume:
            raise SettingsError(
                "elastic and resume cannot be combined: an elastic run keeps its state in the "
                "surviving workers' memory; resume restarts a stopped run from checkpoint_dir"
            )
        if self.compression.prune == "dgc" and self.optimizer != "sgd":
            raise SettingsError(
                f"prune 'dgc' needs optimizer 'sgd', not {self.optimizer!r}: DGC applies momentum "
                "correction itself and feeds plain SGD"
            )
        if self.hierarchy == "sites":
            if self.sites_file is None:
                raise SettingsError(
                    "hierarchy 'sites' needs sites_file (--sites-file or GLOBALDL_SITES_FILE): "
                    "a YAML map `sites: {SITE: [HOST, ...]}`"
                )
            if self.elastic:
                raise SettingsError(
                    "hierarchy 'sites' and elastic cannot be combined yet: the site process "
                    "sets are built once, for a fixed set of devices"
                )
        if self.sites_file is not None:
            try:
                load_site_map(self.sites_file)  # a bad map fails now, not on every device
            except SiteMapError as error:
                raise SettingsError(str(error)) from None
        if self.resume and self.checkpoint_dir is None:
            raise SettingsError("resume needs checkpoint_dir: there is nowhere to resume from")
        reasons = refusals(
            sync_every=self.sync_interval,
            overlap=self.overlap,
            outer_optimizer=self.outer_optimizer,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
            prune=self.compression.prune,
            weight_sparsity=self.compression.weight_sparsity,
            elastic=self.elastic,
        )
        if reasons:
            raise SettingsError(reasons[0])

    @property
    def sync_interval(self) -> SyncInterval:
        """`sync_every` as parsed (the field holds a SyncInterval after validation)."""
        assert isinstance(self.sync_every, SyncInterval)
        return self.sync_every

    def metrics_basic_auth(self) -> tuple[str, str] | None:
        """(user, password) from `metrics_basic_auth_file` (one line `user:password`), or None.

        Kept in a file, not a flag, so the password shows in no process list. Raises
        SettingsError naming the file when it cannot be read or holds no `user:password`.
        """
        if self.metrics_basic_auth_file is None:
            return None
        path = Path(self.metrics_basic_auth_file)
        try:
            line = path.read_text().strip()
        except OSError as error:
            raise SettingsError(
                f"cannot read metrics_basic_auth_file {path}: {error.strerror}"
            ) from None
        user, separator, password = line.partition(":")
        if not separator or not user or not password or "\n" in line:
            raise SettingsError(
                f"metrics_basic_auth_file {path} must hold one line `user:password` with "
                "neither part empty"
            )
        return user, password

    def replace(self, **changes: Any) -> TrainSettings:
        """Return a copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


COMPRESSION_FIELDS: dict[str, dataclasses.Field[Any]] = {
    f.name: f for f in dataclasses.fields(CompressionConfig)
}
TRAIN_FIELDS: dict[str, dataclasses.Field[Any]] = {
    f.name: f for f in dataclasses.fields(TrainSettings) if f.name not in ("extra", "compression")
}
SHARED_FIELDS: tuple[str, ...] = tuple(name for name in TRAIN_FIELDS if name in COMPRESSION_FIELDS)
"""Settings both objects hold (momentum, seed): one value, given to both."""
FIELDS: dict[str, dataclasses.Field[Any]] = {**COMPRESSION_FIELDS, **TRAIN_FIELDS}
"""Every setting a flag, a config file key or a GLOBALDL_* variable may name."""


def resolve_settings(
    flags: Mapping[str, Any],
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> TrainSettings:
    """Merge flags (None = not given) > YAML config file > GLOBALDL_* environment > defaults."""
    environ = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    for name, field_ in FIELDS.items():
        env_value = environ.get(ENV_PREFIX + name.upper())
        if env_value is not None:
            merged[name] = _coerce(name, env_value, field_, source=f"${ENV_PREFIX}{name.upper()}")
    if config_file is not None:
        merged.update(load_config_file(config_file))
    for name, value in flags.items():
        if name not in FIELDS:
            raise SettingsError(f"unknown setting {name!r}; valid settings: {', '.join(FIELDS)}")
        if value is not None:
            merged[name] = value
    compression_values = {name: merged[name] for name in COMPRESSION_FIELDS if name in merged}
    for name in SHARED_FIELDS:
        compression_values.setdefault(name, TRAIN_FIELDS[name].default)
    try:
        compression = CompressionConfig(**compression_values)
    except ValueError as error:
        # The config's own message, unchanged: it is the one validation of these values.
        raise SettingsError(str(error)) from None
    train_values = {name: value for name, value in merged.items() if name in TRAIN_FIELDS}
    return TrainSettings(**train_values, compression=compression)


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML mapping of settings; keys may use dashes or underscores."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise SettingsError(f"cannot read config file {path}: {error.strerror}") from error
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SettingsError(f"config file {path} is not valid YAML: {error}") from error
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"config file {path} must hold a mapping of settings, not {loaded!r}")
    values: dict[str, Any] = {}
    for key, value in loaded.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            raise SettingsError(
                f"unknown setting {key!r} in {path}; valid settings: {', '.join(FIELDS)}"
            )
        values[name] = _coerce(name, value, FIELDS[name], source=str(path))
    return values


def _coerce(name: str, value: Any, field_: dataclasses.Field[Any], source: str) -> Any:
    """Convert a file or environment value to the field's type, naming the source on failure."""
    kind = str(field_.type)
    if value is None:
        return None
    try:
        if "bool" in kind:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if "Path" in kind:
            return Path(str(value))
        if "int" in kind:
            if isinstance(value, float) or (isinstance(value, str) and "." in value):
                raise ValueError(value)
            return int(value)
        if "float" in kind:
            return float(value)
        return str(value)
    except (TypeError, ValueError) as error:
        raise SettingsError(
            f"setting {name} = {value!r} from {source} is not a valid {kind.replace(' | None', '')}"
        ) from error


def _check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        allowed = ", ".join(str(choice) for choice in choices)
        raise SettingsError(f"{name} {value!r} is not one of: {allowed}")


def _check_at_least(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SettingsError(f"{name} {value!r} is not allowed; use a whole number >= {minimum}")


def _check_positive_finite(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise SettingsError(f"{name} {value!r} is not allowed; use a positive number")
