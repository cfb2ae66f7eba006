"""Weight pruning: tfmot's schedule; pruned weights stay zero and nothing is sent for them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from tensorflow_model_optimization.sparsity.keras import PolynomialDecay

from globaldl.compression import Combine, CompressionConfig, GradientCompressor

SHAPES = [
    (50, 40),
    (3, 3, 4, 8),
    (8,),
    (20, 10),
]  # pruned+sparsified, dense kernel, bias, dense kernel


def make(config: CompressionConfig, steps_per_epoch: int = 10):
    rng = np.random.default_rng(0)
    variables = [tf.Variable(rng.normal(size=shape).astype(np.float32)) for shape in SHAPES]
    return GradientCompressor(config, variables, steps_per_epoch=steps_per_epoch), variables


def pruning_config(**overrides) -> CompressionConfig:
    settings = dict(
        prune="topk",
        quantize="int8",
        density=0.05,
        weight_sparsity=0.75,
        weight_pruning_begin_epoch=0,
        weight_pruning_end_epoch=2,
        weight_pruning_frequency_steps=5,
    )
    settings.update(overrides)
    return CompressionConfig(**settings)


def test_schedule_is_tfmot_polynomial_decay():
    compressor, _ = make(pruning_config())
    reference = PolynomialDecay(0.0, 0.75, begin_step=0, end_step=20, power=3, frequency=5)
    for step in (0, 1, 5, 10, 15, 20, 30):
        expected = float(reference(tf.constant(step, tf.int64))[1])
        assert float(compressor.weight_sparsity_at(tf.constant(step))) == pytest.approx(expected)
    assert float(compressor.weight_sparsity_at(tf.constant(20))) == pytest.approx(0.75)


def test_masks_prune_the_smallest_magnitudes_to_the_scheduled_sparsity():
    compressor, variables = make(pruning_config())
    magnitudes_before = [np.abs(v.numpy()) for v in variables]
    assert not bool(compressor.update_weight_masks(tf.constant(3)))  # not a pruning step
    assert bool(compressor.update_weight_masks(tf.constant(20)))
    for index in (0, 1, 3):  # kernels
        weights = variables[index].numpy()
        pruned = weights == 0.0
        size = weights.size
        assert pruned.sum() == int(np.floor(0.75 * size + 0.5))
        assert magnitudes_before[index][pruned].max() <= magnitudes_before[index][~pruned].min()
    assert np.all(variables[2].numpy() != 0.0)  # the bias is never pruned


def test_pruned_weights_stay_zero_through_optimizer_steps_with_momentum():
    compressor, variables = make(pruning_config())
    compressor.update_weight_masks(tf.constant(20))
    pruned = [v.numpy() == 0.0 for v in variables]
    optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    rng = np.random.default_rng(1)
    for step in range(3):
        gradients = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in SHAPES]
        payload, update = compressor.compress(gradients, tf.constant(21 + step, tf.int64))
        averaged, _ = compressor.decompress(payload, tf.size(payload)[tf.newaxis], 1)
        # a raw (unmasked) gradient as well: momentum would revive the weights without the masks
        optimizer.apply_gradients(zip(gradients if step == 0 else averaged, variables, strict=True))
        compressor.apply_state(update)
        compressor.apply_weight_masks()
        for variable, was_pruned in zip(variables, pruned, strict=True):
            assert np.all(variable.numpy()[was_pruned] == 0.0)


@pytest.mark.parametrize(
    ("prune", "quantize"),
    [("topk", "int8"), ("randomk", "sign"), ("dgc", "none"), ("none", "fp16"), ("none", "qsgd")],
)
def test_gradients_of_pruned_weights_are_never_sent(prune, quantize):
    compressor, variables = make(
        pruning_config(prune=prune, quantize=quantize, density=0.5, warmup_epochs=0)
    )
    compressor.update_weight_masks(tf.constant(20))
    keep = [v.numpy() != 0.0 for v in variables]
    unpruned_dense = sum(int(keep[info.index].sum()) for info in compressor.dense_infos)
    rng = np.random.default_rng(2)
    gradients = [tf.constant(rng.normal(size=s).astype(np.float32) + 10.0) for s in SHAPES]
    payload, update = compressor.compress(gradients, tf.constant(21, tf.int64))
    if compressor.combine is Combine.SUM:
        assert (
            int(tf.size(payload)) == sum(int(k.sum()) for k in keep) + 1
        )  # one value per live weight
        averaged, _ = compressor.decompress(payload, None, 1)
    else:
        decoded = compressor.wire.decode(payload, tf.size(payload)[tf.newaxis], unpruned_dense)
        flat_keep = np.concatenate([keep[info.index].ravel() for info in compressor.layout.order])
        assert np.all(flat_keep[decoded.sparse_positions.numpy()])  # every kept index is live
        assert int(decoded.dense_symbols.shape[1]) == unpruned_dense
        averaged, _ = compressor.decompress(payload, tf.size(payload)[tf.newaxis], 1)
    for values, live in zip(averaged, keep, strict=True):
        assert np.all(values.numpy()[~live] == 0.0)
    if update.values:  # the remainder of a pruned weight is dropped, not carried
        for residual, live in zip(compressor.unflatten(update.values[0]), keep, strict=True):
            assert np.all(residual.numpy()[~live] == 0.0)
    assert compressor.fixed_payload_bytes is None  # the dense kernels shrink as they are pruned


def test_mask_gradients_zeroes_pruned_entries_and_is_identity_without_pruning():
    compressor, variables = make(pruning_config())
    compressor.update_weight_masks(tf.constant(20))
    gradients = [tf.ones(s) for s in SHAPES]
    masked = compressor.mask_gradients(gradients)
    for m, v in zip(masked, variables, strict=True):
        np.testing.assert_array_equal(m.numpy() == 0.0, v.numpy() == 0.0)
    plain, _ = make(CompressionConfig(prune="topk"))
    assert plain.mask_gradients(gradients) == gradients
    assert not bool(plain.update_weight_masks(tf.constant(0)))
    assert plain.state_variables == [plain.step_state_variables[0]]
