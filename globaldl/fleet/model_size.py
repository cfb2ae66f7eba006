"""The dense gradient size of the model a `globaldl train` command line would train.

`fleet run` needs it before launching, to size Horovod's timeouts to the links. The arguments
are parsed here as `globaldl train` parses them (no TensorFlow); building the model needs
TensorFlow, so that runs once in a short child process (`python -m globaldl.fleet.model_size
SPEC_JSON`) and the answer is cached per model shape and models-package source.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from globaldl.files import write_text_atomically
from globaldl.settings import TrainSettings, resolve_settings

TIMEOUT_SECONDS = 180.0
FP32_BYTES = 4
# Only these settings decide the model's weights (and so its gradient size).
SHAPE_SETTINGS = ("model", "dataset", "depth", "layers", "width")
MODELS_SOURCE = Path(__file__).resolve().parents[1] / "models"


def default_cache_path() -> Path:
    """Where sizes are remembered (GLOBALDL_CACHE, as the set-up's wheel cache)."""
    root = os.environ.get("GLOBALDL_CACHE") or Path.home() / ".cache" / "globaldl"
    return Path(root) / "model-sizes.json"


def parse_train_settings(
    train_args: Sequence[str], environ: Mapping[str, str] | None = None
) -> TrainSettings:
    """`globaldl train` arguments parsed exactly as `globaldl train` parses them (no TensorFlow).

    `environ` is the environment the workers will see (default: this process's); its
    GLOBALDL_* variables count as they will there. Raises ValueError (the settings' own
    message) when the arguments are not valid.
    """
    import typer

    from globaldl.cli.train import train

    app = typer.Typer(add_completion=False)
    app.command()(train)
    command = typer.main.get_command(app)
    try:
        context = command.make_context("globaldl train", list(train_args))
    except typer.TyperException as error:
        # Typer's (vendored click) usage errors: an unknown option, a value of the wrong type.
        format_message = getattr(error, "format_message", None)
        message = format_message() if format_message is not None else str(error)
        raise ValueError(f"`globaldl train` arguments: {message}") from None
    flags = dict(context.params)
    flags.pop("verbose")  # a display option of the command, not a setting (as `train` drops it)
    return resolve_settings(flags, flags.pop("config"), environ)


def dense_gradient_bytes(settings: TrainSettings, cache_path: Path | None = None) -> int:
    """Bytes of every trainable weight in fp32: what one dense step's allreduce carries."""
    shape = {name: getattr(settings, name) for name in SHAPE_SETTINGS}
    cache_path = cache_path or default_cache_path()
    key = json.dumps({**shape, "models_source": _models_source_digest()}, sort_keys=True)
    cache = _read_cache(cache_path)
    if key in cache:
        return int(cache[key])
    completed = subprocess.run(
        [sys.executable, "-m", "globaldl.fleet.model_size", json.dumps(shape)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if completed.returncode != 0:
        lines = completed.stderr.strip().splitlines()
        raise ValueError(
            f"could not build the model {shape} to size its gradients: "
            f"{lines[-1] if lines else f'exit {completed.returncode}'}"
        )
    size = int(json.loads(completed.stdout.strip().splitlines()[-1])["dense_gradient_bytes"])
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(
            cache_path, json.dumps({**_read_cache(cache_path), key: size}, indent=1)
        )
    except OSError:
        pass  # a cache that cannot be written costs the next run a few seconds, nothing more
    return size


def _models_source_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(MODELS_SOURCE.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def main(argv: list[str] | None = None) -> None:
    """Build the model a shape (JSON of SHAPE_SETTINGS) describes and print its gradient size."""
    shape = json.loads((sys.argv[1:] if argv is None else argv)[0])

    import tensorflow as tf

    from globaldl.models import build_model
    from globaldl.pipelines.datasets import dataset_spec

    spec = dataset_spec(shape["dataset"])
    model = build_model(
        shape["model"],
        input_shape=spec.input_shape,
        num_classes=spec.num_classes,
        resnet_depth=shape["depth"],
        mlp_layers=shape["layers"],
        mlp_width=shape["width"],
    )
    model(tf.zeros((1, *spec.input_shape)), training=False)
    parameters = sum(int(variable.shape.num_elements()) for variable in model.trainable_variables)
    print(
        json.dumps(
            {**shape, "parameters": parameters, "dense_gradient_bytes": FP32_BYTES * parameters}
        )
    )


if __name__ == "__main__":
    main()
