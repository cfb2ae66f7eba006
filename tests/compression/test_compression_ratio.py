"""Compression ratios on the gradient shapes of ResNet-20 (random gradients)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from resnet20_shapes import resnet20_shapes

from globaldl.compression import CompressionConfig, GradientCompressor, compression_ratio

TARGET_RATIO = 300


@pytest.fixture(scope="module")
def resnet20():
    shapes = resnet20_shapes()
    variables = [tf.Variable(tf.zeros(s)) for s in shapes]
    rng = np.random.default_rng(0)
    gradients = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes]
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


def test_resnet20_has_the_published_parameter_count(resnet20):
    variables, _ = resnet20
    assert sum(v.shape.num_elements() for v in variables) == 269_722


def test_topk_0_001_with_a_scaled_quantizer_compresses_resnet20_at_least_300x(resnet20):
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
    for quantize in ("int8", "qsgd", "terngrad", "sign"):
        assert report[quantize] >= TARGET_RATIO, report
    # fewer bits per value, higher ratio
    order = ["none", "fp16", "int8", "qsgd", "terngrad", "sign"]
    assert [report[q] for q in order] == sorted(report[q] for q in order), report
    assert report["topk 0.01 + int8"] < report["int8"]
