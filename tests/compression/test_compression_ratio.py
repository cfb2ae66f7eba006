"""Compression ratios on the gradient shapes of the project's ResNet-20 (random gradients).

The shapes are read from the model `globaldl.models` builds (projection shortcuts), not from
the paper's identity-shortcut variant, so the figures here are the ones training sends.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from globaldl.compression import CompressionConfig, GradientCompressor, compression_ratio
from globaldl.models import build_model

TARGET_RATIO = 300
"""Issue 10's target: top-k at density 0.001 plus a quantizer compresses ResNet-20 >= 300x."""

INT8_RATIO_REAL_MODEL = 279.53
"""What top-k 0.001 + int8 gives on the real shapes (fixed-size payload: 1,089,896 / 3,899
bytes). Below the target, see test_topk_0_001_int8_misses_300x_because_of_the_dense_tensors."""


@pytest.fixture(scope="module")
def resnet20():
    model = build_model("resnet", input_shape=(32, 32, 3), num_classes=10, resnet_depth=20)
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    gradients = [
        tf.constant(rng.normal(size=v.shape.as_list()).astype(np.float32)) for v in variables
    ]
    return variables, gradients


def measured_ratio(resnet20, **settings) -> tuple[float, GradientCompressor, int]:
    variables, gradients = resnet20
    compressor = GradientCompressor(CompressionConfig(**settings), variables, steps_per_epoch=100)
    payload, _ = compressor.compress(gradients, tf.constant(1000, tf.int64))
    payload_bytes = int(compressor.wire_bytes(payload))
    return (
        compression_ratio(compressor.raw_bytes_per_step, payload_bytes),
        compressor,
        payload_bytes,
    )


def test_resnet20_with_projection_shortcuts_has_2752_more_parameters_than_the_paper(resnet20):
    variables, _ = resnet20
    # The paper's 269,722 (identity shortcuts) + two 1x1 projections (16*32 + 32*64) and
    # their batch normalisation (2 * (32 + 64)).
    assert sum(v.shape.num_elements() for v in variables) == 269_722 + 512 + 2048 + 192


def test_topk_0_001_with_a_scaled_quantizer_compresses_resnet20(resnet20):
    report = {}
    for quantize in ("none", "fp16", "int8", "qsgd", "terngrad", "sign"):
        ratio, compressor, payload_bytes = measured_ratio(
            resnet20, prune="topk", density=0.001, quantize=quantize
        )
        assert payload_bytes == compressor.fixed_payload_bytes
        report[quantize] = ratio
    ratio, _, _ = measured_ratio(resnet20, prune="topk", density=0.01, quantize="int8")
    report["topk 0.01 + int8"] = ratio
    print("\nResNet-20 compression ratios (dense fp32 bytes / payload bytes):")
    for name, value in report.items():
        print(f"  {name:>18}: {value:7.1f}x")
    for quantize in ("qsgd", "terngrad", "sign"):
        assert report[quantize] >= TARGET_RATIO, report
    # int8 does NOT reach the target on the real model; the next test says why.
    assert report["int8"] == pytest.approx(INT8_RATIO_REAL_MODEL, abs=0.01), report
    assert report["int8"] < TARGET_RATIO
    # fewer bits per value, higher ratio
    order = ["none", "fp16", "int8", "qsgd", "terngrad", "sign"]
    assert [report[q] for q in order] == sorted(report[q] for q in order), report
    assert report["topk 0.01 + int8"] < report["int8"]


def test_topk_0_001_int8_misses_300x_because_of_the_dense_tensors(resnet20):
    """The tensors below dense_below_elements travel whole (8 bits each): most of the bytes.

    Without them the pruned part alone compresses its share of the model beyond 300x; the
    batch-norm parameters of 21 normalisation layers, the first convolution, the 16->32
    projection and the classifier (3,162 entries) take the payload below the target.
    """
    _, compressor, payload_bytes = measured_ratio(
        resnet20, prune="topk", density=0.001, quantize="int8"
    )
    dense_bytes = int(compressor.wire.dense_section_bytes(compressor.dense_elements))
    assert compressor.dense_elements == 3162
    assert dense_bytes > payload_bytes / 2
    pruned_raw_bytes = 4 * compressor.sparse_elements
    assert pruned_raw_bytes / (payload_bytes - dense_bytes) >= TARGET_RATIO
