"""Quantizers against NumPy references, and the codec registry."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from globaldl import compression
from globaldl.compression import (
    DGC,
    FP16,
    PRUNE_NAMES,
    QSGD,
    QUANTIZE_NAMES,
    QUANTIZERS,
    SPARSIFIERS,
    Int8,
    NoQuantization,
    RandomK,
    Sign,
    TernGrad,
    Threshold,
    TopK,
)
from globaldl.compression.blocks import block_layout

SETTINGS = settings(max_examples=25, deadline=None)
finite_values = hnp.arrays(
    np.float32,
    st.integers(0, 600),
    elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False),
)


# Quantizers that also encode per value for a gathered payload (intsum only sums).
GATHERABLE = [name for name in QUANTIZE_NAMES if QUANTIZERS.get_class(name).gatherable]


def seed(value: int) -> tf.Tensor:
    return tf.constant([value, 12345], tf.int64)


# ------------------------------------------------------------------------------ registry
def test_registries_hold_exactly_the_contract_names():
    assert set(SPARSIFIERS.names) == set(PRUNE_NAMES)
    assert set(QUANTIZERS.names) == set(QUANTIZE_NAMES)


def test_get_accepts_a_name_a_config_dict_and_an_instance():
    assert compression.get("topk") == TopK()
    assert compression.get({"class_name": "int8", "config": {"block_size": 64}}) == Int8(64)
    assert compression.get({"class_name": "QSGD", "config": {"levels": 4}}) == QSGD(levels=4)
    instance = Sign(block_size=32)
    assert compression.get(instance) is instance
    assert compression.get_quantizer("none") == NoQuantization()
    assert compression.get_sparsifier("none").name == "none"


def test_get_rejects_unknown_names_listing_the_valid_ones():
    with pytest.raises(ValueError, match=r"'topq'.*'topk'.*'int8'"):
        compression.get("topq")
    with pytest.raises(ValueError, match=r"unknown quantizer 'int4'.*'int8'"):
        compression.get_quantizer("int4")
    with pytest.raises(ValueError, match="names both"):
        compression.get("none")
    with pytest.raises(ValueError, match="class_name"):
        compression.get_quantizer({"config": {}})
    with pytest.raises(ValueError, match="cannot interpret 3"):
        compression.get_sparsifier(3)


@pytest.mark.parametrize(
    "codec",
    [
        NoQuantization(),
        compression.NoPruning(),
        FP16(),
        Int8(block_size=64),
        QSGD(levels=7, block_size=32),
        TernGrad(block_size=128),
        Sign(block_size=16),
        TopK(),
        RandomK(),
        Threshold(sample_ratio=0.05, min_sample_elements=100),
        DGC(
            momentum=0.5,
            clip_norm=2.0,
            warmup_epochs=2,
            sample_ratio=0.02,
            min_sample_elements=50,
            oversampling=1.5,
        ),
    ],
    ids=lambda c: c.name,
)
def test_every_codec_config_round_trips(codec):
    rebuilt = compression.get(compression.serialize(codec))
    assert rebuilt == codec
    assert rebuilt.get_config() == codec.get_config()
    assert type(codec).from_config(codec.get_config()) == codec


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: Int8(block_size=0), r"block_size=0 is out of range; allowed: \[1, inf\)"),
        (lambda: QSGD(levels=0), r"levels=0 is out of range"),
        (lambda: QSGD(levels=2.5), r"levels=2.5 must be of type int"),
        (lambda: DGC(momentum=1.0), r"momentum=1.0 is out of range; allowed: \[0.0, 1.0\)"),
        (lambda: DGC(clip_norm=0.0), r"clip_norm=0.0 is out of range"),
        (lambda: Threshold(sample_ratio=0.0), r"sample_ratio=0.0 is out of range"),
    ],
)
def test_codec_arguments_are_validated_by_name(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


# ----------------------------------------------------------------------------- quantizers
def consecutive_scales(quantizer, values: np.ndarray) -> np.ndarray:
    """The scale in force for every value under consecutive blocks."""
    quantized = quantizer.quantize(tf.constant(values))
    return np.repeat(quantized.scales.numpy(), quantizer.block_size)[: len(values)]


@SETTINGS
@given(finite_values, st.sampled_from([1, 7, 256]))
def test_int8_error_is_at_most_half_a_step_of_its_block_scale(values, block_size):
    quantizer = Int8(block_size=block_size)
    quantized = quantizer.quantize(tf.constant(values))
    error = np.abs(quantized.reconstruction.numpy() - values)
    scale = consecutive_scales(quantizer, values)
    assert np.all(error <= scale / 2 * (1 + 1e-6) + 1e-30)
    # and the step is max|block| / 127 within bfloat16 rounding
    for start in range(0, len(values), block_size):
        block = values[start : start + block_size]
        assert scale[start] == pytest.approx(np.abs(block).max() / 127, rel=2.0**-7, abs=1e-38)


@SETTINGS
@given(hnp.arrays(np.float32, st.integers(0, 300), elements=st.floats(-6e4, 6e4, width=32)))
def test_fp16_relative_error_is_within_2_to_minus_11(values):
    reconstruction = FP16().quantize(tf.constant(values)).reconstruction.numpy()
    normal = np.abs(values) >= 2.0**-14
    np.testing.assert_array_less(
        np.abs(reconstruction - values)[normal],
        np.abs(values)[normal] * 2.0**-11 * (1 + 1e-6) + 1e-30,
    )
    assert np.all(np.abs(reconstruction - values)[~normal] <= 2.0**-25)


def test_fp16_clips_instead_of_overflowing():
    reconstruction = FP16().quantize(tf.constant([1e6, -1e9], tf.float32)).reconstruction.numpy()
    assert reconstruction.tolist() == [65504.0, -65504.0]


def unbiasedness_check(quantizer, values: np.ndarray, draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean over ``draws`` independent quantizations, and the per-value standard error bound."""
    # One call: each copy of the vector is its own block, so every draw uses the same scale.
    tiled = np.tile(values, draws)
    blocks = block_layout(
        tf.range(len(tiled)),
        tf.constant(np.repeat(np.arange(draws), len(values)), tf.int32),
        draws,
        np.arange(draws) * len(values),
        len(values),
    )
    quantized = quantizer.quantize(tf.constant(tiled), seed(3), blocks)
    mean = quantized.reconstruction.numpy().reshape(draws, len(values)).mean(axis=0)
    scale = quantized.scales.numpy()[0]
    return mean, scale


def test_qsgd_is_unbiased():
    values = np.random.default_rng(4).normal(size=64).astype(np.float32)
    draws = 4000
    quantizer = QSGD(levels=4, block_size=64)
    mean, norm = unbiasedness_check(quantizer, values, draws)
    # per draw std <= norm / (2 * levels); 5 standard errors of the mean
    np.testing.assert_allclose(mean, values, atol=5 * norm / (2 * 4) / np.sqrt(draws))
    assert np.abs(mean - values).max() > 0  # it is stochastic, not a rounding


def test_terngrad_is_unbiased():
    values = np.random.default_rng(5).normal(size=64).astype(np.float32)
    draws = 4000
    mean, scale = unbiasedness_check(TernGrad(block_size=64), values, draws)
    np.testing.assert_allclose(mean, values, atol=5 * scale / 2 / np.sqrt(draws))


def test_terngrad_and_qsgd_send_values_on_their_grid():
    values = np.random.default_rng(6).normal(size=300).astype(np.float32)
    tern = TernGrad(block_size=300).quantize(tf.constant(values), seed(1))
    scale = tern.scales.numpy()[0]
    assert set(np.unique(tern.reconstruction.numpy() / scale).round(6)) <= {-1.0, 0.0, 1.0}
    qsgd = QSGD(levels=8, block_size=300).quantize(tf.constant(values), seed(1))
    levels = qsgd.reconstruction.numpy() / qsgd.scales.numpy()[0] * 8
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)


def test_sign_sends_block_mean_magnitude_times_sign():
    values = np.array([3.0, -1.0, 0.0, -4.0, 2.0], np.float32)
    quantized = Sign(block_size=4).quantize(tf.constant(values))
    np.testing.assert_allclose(quantized.scales.numpy(), [2.0, 2.0])
    np.testing.assert_allclose(quantized.reconstruction.numpy(), [2.0, -2.0, 2.0, -2.0, 2.0])
    assert quantized.symbols.numpy().tolist() == [1, 0, 1, 0, 1]


@pytest.mark.parametrize("name", GATHERABLE)
def test_all_zero_values_decode_to_zero(name):
    quantized = compression.get_quantizer(name).quantize(tf.zeros([300]), seed(2))
    assert np.all(quantized.reconstruction.numpy() == 0.0)


@pytest.mark.parametrize("name", GATHERABLE)
def test_symbols_fit_in_bits_per_value_and_dequantize_inverts_quantize(name):
    quantizer = (
        compression.get({"class_name": name, "config": {}}) if name != "none" else NoQuantization()
    )
    values = np.random.default_rng(7).laplace(size=700).astype(np.float32)
    quantized = quantizer.quantize(tf.constant(values), seed(9))
    symbols = quantized.symbols.numpy()
    if quantizer.bits_per_value < 32:
        assert symbols.min() >= 0 and symbols.max() < 2**quantizer.bits_per_value
    decoded = quantizer.dequantize(tf.constant(symbols[np.newaxis]), quantized.scales[tf.newaxis])
    np.testing.assert_array_equal(decoded.numpy()[0], quantized.reconstruction.numpy())


def test_none_quantizer_is_lossless():
    values = np.random.default_rng(8).normal(size=100).astype(np.float32)
    np.testing.assert_array_equal(
        NoQuantization().quantize(tf.constant(values)).reconstruction.numpy(), values
    )


def test_blocks_of_kept_values_restart_at_every_tensor_and_rank():
    positions = tf.constant([0, 1, 2, 3, 10, 11, 12, 13], tf.int32)
    ranks = tf.constant([0, 0, 0, 0, 0, 0, 1, 1], tf.int32)
    layout = block_layout(positions, ranks, 2, np.array([0, 10]), block_size=3)
    assert layout.block_ids.numpy().tolist() == [0, 0, 0, 1, 2, 2, 3, 3]
    assert layout.index_in_block.numpy().tolist() == [0, 1, 2, 0, 0, 1, 0, 1]
    assert layout.blocks_per_run.numpy().tolist() == [3, 1]
