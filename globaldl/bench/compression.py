"""Compression benchmark: bytes saved and codec time, on the real gradients of real models.

For each model, one real batch gives real gradients (forward + backward, timed as the step's
compute). Each prune x quantize combination then compresses those gradients and decompresses
the payloads of two simulated ranks, inside one `tf.function`, as the training step does.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

WORKLOADS: dict[str, dict[str, Any]] = {
    "lenet": {"model": "lenet", "dataset": "mnist", "resnet_depth": 20},
    "resnet20": {"model": "resnet", "dataset": "cifar-synthetic", "resnet_depth": 20},
}
# (prune, density, quantize): the baselines, each step alone, and the two steps together.
COMBINATIONS: list[tuple[str, float, str]] = [
    ("none", 1.0, "none"),
    ("none", 1.0, "fp16"),
    ("none", 1.0, "int8"),
    ("none", 1.0, "qsgd"),
    ("none", 1.0, "sign"),
    ("topk", 0.01, "none"),
    ("topk", 0.01, "int8"),
    ("topk", 0.001, "int8"),
    ("topk", 0.001, "qsgd"),
    ("topk", 0.001, "terngrad"),
    ("topk", 0.001, "sign"),
    ("randomk", 0.01, "int8"),
    ("threshold", 0.001, "int8"),
    ("dgc", 0.001, "int8"),
]
SIMULATED_RANKS = 2
RECOMMENDED_FLAGS = ["--prune", "topk", "--density", "0.01", "--quantize", "int8"]


def _median_seconds(function: Callable[[], Any], repeats: int) -> float:
    function()  # trace and warm up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _real_gradients(workload: dict[str, Any], batch_size: int, repeats: int):
    import tf_keras as keras

    from globaldl.models import build_model
    from globaldl.pipelines import make_pipeline

    pipeline = make_pipeline(
        workload["dataset"], rank=0, num_ranks=1, batch_size=batch_size, seed=0
    )
    images, labels = next(iter(pipeline.train_batches(0)))
    spec = pipeline.spec
    model = build_model(
        workload["model"],
        input_shape=spec.input_shape,
        num_classes=spec.num_classes,
        resnet_depth=workload["resnet_depth"],
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def forward_backward() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        return tape.gradient(loss, model.trainable_variables)

    compute_seconds = _median_seconds(lambda: [g.numpy() for g in forward_backward()], repeats)
    return model.trainable_variables, forward_backward(), compute_seconds


def _measure_codec(variables, gradients, prune: str, density: float, quantize: str, repeats: int):
    from globaldl.compression import Combine, CompressionConfig, GradientCompressor

    config = CompressionConfig(prune=prune, density=density, quantize=quantize, warmup_epochs=0)
    compressor = GradientCompressor(
        config, list(variables), steps_per_epoch=1, rank=0, num_ranks=SIMULATED_RANKS
    )
    step = tf.constant(1000, tf.int64)

    @tf.function
    def round_trip() -> tuple[tf.Tensor, tf.Tensor]:
        payload, _ = compressor.compress(gradients, step)
        if compressor.combine is Combine.SUM:
            exchanged = payload * SIMULATED_RANKS
        else:
            exchanged = tf.concat([payload] * SIMULATED_RANKS, axis=0)
        lengths = tf.fill([SIMULATED_RANKS], tf.size(payload, out_type=tf.int32))
        averaged, _ = compressor.decompress(exchanged, lengths, tf.constant(SIMULATED_RANKS))
        return compressor.wire_bytes(payload), tf.add_n([tf.reduce_sum(g) for g in averaged])

    codec_seconds = _median_seconds(lambda: round_trip()[1].numpy(), repeats)
    wire_bytes = int(round_trip()[0].numpy())
    return compressor.raw_bytes_per_step, wire_bytes, codec_seconds


def run_codec_benchmark(
    batch_size: int,
    repeats: int,
    workloads: list[str] | None = None,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """One row per workload x combination: ratio, codec and compute milliseconds."""
    rows = []
    for name in workloads or list(WORKLOADS):
        variables, gradients, compute_seconds = _real_gradients(
            WORKLOADS[name], batch_size, repeats
        )
        for prune, density, quantize in COMBINATIONS:
            raw, wire, codec_seconds = _measure_codec(
                variables, gradients, prune, density, quantize, repeats
            )
            row = {
                "workload": name,
                "prune": prune,
                "density": density if prune != "none" else None,
                "quantize": quantize,
                "raw_bytes": raw,
                "wire_bytes": wire,
                "ratio": raw / wire,
                "codec_ms": 1000 * codec_seconds,
                "compute_ms": 1000 * compute_seconds,
                "codec_share_of_compute": codec_seconds / compute_seconds,
            }
            rows.append(row)
            progress(
                f"{name:9s} {prune:9s} {quantize:8s} ratio {row['ratio']:8.1f}x  "
                f"codec {row['codec_ms']:7.2f} ms  compute {row['compute_ms']:7.2f} ms"
            )
    return rows


def run_accuracy_check(
    epochs: int, progress: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """LeNet on MNIST with 2 Horovod ranks, dense and with the recommended preset."""
    bin_dir = Path(sys.executable).parent
    rows = []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryDirectory() as scratch:
        for label, flags in (("dense", []), ("topk 0.01 + int8", RECOMMENDED_FLAGS)):
            summary_path = Path(scratch) / "summary.json"
            command = [
                str(bin_dir / "horovodrun"),
                "-np",
                "2",
                "-H",
                "localhost:2",
                "--gloo",
                str(bin_dir / "globaldl"),
                "train",
                "--epochs",
                str(epochs),
                *flags,
                "--summary",
                str(summary_path),
            ]
            subprocess.run(command, check=True, env=env, capture_output=True, timeout=1800)
            result = json.loads(summary_path.read_text())
            rows.append(
                {
                    "run": label,
                    "epochs": epochs,
                    "val_accuracy": result["val_accuracy"],
                    "compression_ratio": result["compression_ratio"],
                    "wall_seconds": result["wall_seconds"],
                }
            )
            progress(f"accuracy {label}: {result['val_accuracy']:.4f}")
    return rows
