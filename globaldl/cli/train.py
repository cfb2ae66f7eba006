"""`globaldl train`: one worker of a (possibly multi-device) training run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from globaldl.cli.errors import user_errors
from globaldl.cli.quiet import quiet_native_start
from globaldl.compression.config import PRUNE_NAMES, QUANTIZE_NAMES
from globaldl.local_sgd.schedule import OUTER_OPTIMIZER_NAMES
from globaldl.settings import (
    BALANCE_NAMES,
    BATCH_NORM_NAMES,
    DATASET_NAMES,
    HIERARCHY_NAMES,
    LR_DECAY_NAMES,
    MODEL_NAMES,
    OPTIMIZER_NAMES,
    RESNET_DEPTHS,
    resolve_settings,
)


def _choices(names: tuple[object, ...]) -> str:
    # Comma and space: a help layout wraps between choices; `a|b|c` is one word it must cut.
    return ", ".join(str(name) for name in names)


class PlainHelpCommand(TyperCommand):
    """`train --help` in click's plain layout: at 80 columns it wraps every option and choice.

    Rich's three-column table gives ~25 columns to the help of 38 options there and cuts what
    does not fit (`lenet|resnet|mlp|vi…`, `--max-steps-per-epo…`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["rich_markup_mode"] = None
        super().__init__(*args, **kwargs)


def train(
    config: Annotated[
        Path | None, typer.Option(help="YAML file of settings (flag > file > GLOBALDL_* env).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help=f"Model: {_choices(MODEL_NAMES)} (default: lenet).")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help=f"Dataset: {_choices(DATASET_NAMES)} (default: mnist).")
    ] = None,
    depth: Annotated[
        int | None, typer.Option(help=f"ResNet depth: {_choices(RESNET_DEPTHS)} (default: 20).")
    ] = None,
    layers: Annotated[int | None, typer.Option(help="MLP hidden layers (default: 3).")] = None,
    width: Annotated[int | None, typer.Option(help="MLP layer width (default: 128).")] = None,
    batch_norm: Annotated[
        str | None,
        typer.Option(
            help=f"Batch normalisation across ranks: {_choices(BATCH_NORM_NAMES)}; local = each "
            "rank's batch statistics, moving statistics averaged at every epoch end and commit; "
            "sync = Horovod's synchronised statistics, two collectives per layer per step "
            "(default: local)."
        ),
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs (default: 2).")] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Batch size per rank (default: 16).")
    ] = None,
    max_steps_per_epoch: Annotated[
        int | None, typer.Option(help="Cap on steps per epoch (short runs).")
    ] = None,
    optimizer: Annotated[
        str | None,
        typer.Option(help=f"Optimizer: {_choices(OPTIMIZER_NAMES)} (default: sgd with momentum)."),
    ] = None,
    learning_rate: Annotated[
        float | None, typer.Option(help="Learning rate for one rank (default: 0.01).")
    ] = None,
    momentum: Annotated[
        float | None, typer.Option(help="SGD momentum (DGC: momentum correction) (default: 0.9).")
    ] = None,
    scale_lr: Annotated[
        bool | None,
        typer.Option(
            "--scale-lr/--no-scale-lr",
            help="Multiply the learning rate by the number of ranks (default: on).",
        ),
    ] = None,
    lr_warmup_epochs: Annotated[
        int | None,
        typer.Option(help="Ramp the learning rate up linearly over these epochs (default: 0)."),
    ] = None,
    lr_decay: Annotated[
        str | None,
        typer.Option(
            help=f"After the warm-up: {_choices(LR_DECAY_NAMES)}; cosine = decay to 0 by the "
            "last step (default: none)."
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed for data order, initial weights and codecs (default: 0)."),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Materialise the dataset as sharded TFRecords here and train from disk."),
    ] = None,
    input_delay_ms: Annotated[
        float | None,
        typer.Option(
            help="Deliberate delay per batch in the input pipeline, in ms (demonstrates an I/O "
            "bottleneck)."
        ),
    ] = None,
    input_delay_rank: Annotated[
        int | None,
        typer.Option(
            help="Add the input delay on this rank only, a device whose input lags the others' "
            "(default: every rank)."
        ),
    ] = None,
    checkpoint_dir: Annotated[
        Path | None, typer.Option(help="Write a checkpoint here after every epoch.")
    ] = None,
    resume: Annotated[
        bool | None,
        typer.Option(
            "--resume/--no-resume",
            help="Resume from the newest good checkpoint in --checkpoint-dir.",
        ),
    ] = None,
    summary: Annotated[
        Path | None, typer.Option(help="Rank 0 writes the JSON run summary here (atomically).")
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(help="Run id for metrics and summary (default: from rank 0's start time)."),
    ] = None,
    prune: Annotated[
        str | None,
        typer.Option(help=f"Step 1, gradient pruning: {_choices(PRUNE_NAMES)} (default: none)."),
    ] = None,
    density: Annotated[
        float | None,
        typer.Option(help="Fraction of gradient entries kept by pruning (default: 0.01)."),
    ] = None,
    quantize: Annotated[
        str | None,
        typer.Option(help=f"Step 2, quantization: {_choices(QUANTIZE_NAMES)} (default: none)."),
    ] = None,
    error_feedback: Annotated[
        bool | None,
        typer.Option(
            "--error-feedback/--no-error-feedback",
            help="Carry what was not sent into the next step (default: on).",
        ),
    ] = None,
    block_size: Annotated[
        int | None, typer.Option(help="int8: values per scale (default: 256).")
    ] = None,
    qsgd_levels: Annotated[
        int | None, typer.Option(help="QSGD quantization levels (default: 16).")
    ] = None,
    sum_bits: Annotated[
        int | None,
        typer.Option(
            help="intsum: bits per value on the wire, whatever the number of ranks; 8 sums "
            "up to 127 ranks, 12 up to 2047, 16 up to 32767 (default: 8)."
        ),
    ] = None,
    explore_fraction: Annotated[
        float | None,
        typer.Option(
            help="shared-topk: share of k drawn at random instead of from the shared score "
            "(default: 0.1)."
        ),
    ] = None,
    powersgd_rank: Annotated[
        int | None,
        typer.Option(help="powersgd: rank of each gradient matrix's factors (default: 2)."),
    ] = None,
    weight_sparsity: Annotated[
        float | None, typer.Option(help="Final fraction of weights pruned to zero (default: 0).")
    ] = None,
    warmup_epochs: Annotated[
        int | None, typer.Option(help="DGC: epochs over which density ramps down (default: 0).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port + local rank.")
    ] = None,
    metrics_addr: Annotated[
        str | None, typer.Option(help="Address the metrics endpoint binds to (default: 127.0.0.1).")
    ] = None,
    metrics_certfile: Annotated[
        Path | None, typer.Option(help="TLS certificate for the metrics endpoint.")
    ] = None,
    metrics_keyfile: Annotated[
        Path | None, typer.Option(help="TLS key for the metrics endpoint.")
    ] = None,
    metrics_basic_auth_file: Annotated[
        Path | None,
        typer.Option(
            help="File with one line user:password; the metrics endpoint then requires HTTP "
            "basic auth."
        ),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="Device name in metrics (default: host name).")
    ] = None,
    hierarchy: Annotated[
        str | None,
        typer.Option(
            help=f"Exchange: {_choices(HIERARCHY_NAMES)}; sites = sum in each site, then "
            "across sites between one leader per site, then back (needs a codec whose "
            "payloads sum) (default: none)."
        ),
    ] = None,
    sites_file: Annotated[
        Path | None,
        typer.Option(help="Site map for --hierarchy sites: YAML `sites: {SITE: [HOST, ...]}`."),
    ] = None,
    balance: Annotated[
        str | None,
        typer.Option(
            help=f"Work per device: {_choices(BALANCE_NAMES)}; speed = local batch in "
            "proportion to measured speed (default: equal)."
        ),
    ] = None,
    elastic: Annotated[
        bool | None,
        typer.Option(
            "--elastic/--no-elastic",
            help="Run under Horovod Elastic (horovodrun --min-np/--max-np/"
            "--host-discovery-script): devices may leave and join (default: off).",
        ),
    ] = None,
    commit_every: Annotated[
        int | None,
        typer.Option(
            help="Elastic: commit the training state every K steps; a failure loses "
            "at most K steps (default: 20)."
        ),
    ] = None,
    sync_every: Annotated[
        str | None,
        typer.Option(
            help="Local steps per round (16), or a wall-clock budget per round (2s); each round "
            "ends with one exchange of the compressed model delta (default: 1, the per-step "
            "gradient exchange)."
        ),
    ] = None,
    overlap: Annotated[
        bool | None,
        typer.Option(
            "--overlap/--no-overlap",
            help="Exchange round t while round t+1 computes; apply it one round late "
            "(default: off).",
        ),
    ] = None,
    outer_optimizer: Annotated[
        str | None,
        typer.Option(
            help=f"Optimizer applying the averaged round delta: {_choices(OUTER_OPTIMIZER_NAMES)} "
            "(DiLoCo: nesterov; default: sgd).",
        ),
    ] = None,
    outer_lr: Annotated[
        float | None,
        typer.Option(help="Outer learning rate; sgd at 1.0 is plain model averaging (default: 1)."),
    ] = None,
    outer_momentum: Annotated[
        float | None,
        typer.Option(help="Outer momentum (default: 0.9 for nesterov, 0 for sgd)."),
    ] = None,
    inject_nan_step: Annotated[
        int | None,
        typer.Option(help="Fault injection: make one rank's gradients NaN at this global step."),
    ] = None,
    inject_nan_rank: Annotated[
        int | None,
        typer.Option(help="Fault injection: the rank whose gradients turn NaN (default: 0)."),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", help="Show TensorFlow's native start-up messages (hidden by default)."
        ),
    ] = False,
) -> None:
    """Train a model; run it alone, or under horovodrun on many devices with no change."""
    flags = dict(locals())
    config_file = flags.pop("config")
    flags.pop("verbose")
    with user_errors():
        settings = resolve_settings(flags, config_file)
        # TensorFlow loads only once the settings are valid.
        with quiet_native_start(verbose):
            if settings.elastic:
                from globaldl.elastic import run_elastic as run
            else:
                from globaldl.trainer import run
        run(settings)
