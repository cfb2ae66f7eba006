"""CompressionConfig validation and round trip."""

from __future__ import annotations

import json

import pytest

from globaldl.compression import PRUNE_NAMES, QUANTIZE_NAMES, CompressionConfig


def test_defaults_are_valid_and_round_trip_through_json():
    config = CompressionConfig(prune="dgc", density=0.001, quantize="sign", clip_norm=5.0)
    restored = CompressionConfig.from_config(json.loads(json.dumps(config.get_config())))
    assert restored == config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prune", "top_k", r"prune='top_k' is not valid; allowed: \['none', 'topk'"),
        ("quantize", "int4", r"quantize='int4' is not valid; allowed: \['none', 'fp16'"),
        ("density", 0.0, r"density=0.0 is out of range; allowed: \(0.0, 1.0\]"),
        ("density", 1.5, r"density=1.5 is out of range"),
        ("density", float("nan"), r"density=nan is out of range"),
        ("density", "0.1", r"density='0.1' must be of type int or float"),
        ("error_feedback", 1, r"error_feedback=1 must be of type bool"),
        ("block_size", 0, r"block_size=0 is out of range"),
        ("qsgd_levels", 40000, r"qsgd_levels=40000 is out of range; allowed: \[1, 32767\]"),
        ("dense_below_elements", -1, r"dense_below_elements=-1 is out of range"),
        ("weight_sparsity", 1.0, r"weight_sparsity=1.0 is out of range; allowed: \[0.0, 1.0\)"),
        (
            "weight_pruning_end_epoch",
            0,
            r"weight_pruning_end_epoch=0 is out of range; allowed: \(0, inf\)",
        ),
        ("momentum", -0.1, r"momentum=-0.1 is out of range"),
        ("clip_norm", 0.0, r"clip_norm=0.0 is out of range"),
        ("warmup_epochs", True, r"warmup_epochs=True must be a number, not a bool"),
        ("sample_ratio", 0.0, r"sample_ratio=0.0 is out of range"),
        ("seed", -1, r"seed=-1 is out of range"),
    ],
)
def test_invalid_settings_name_the_field_value_and_allowed_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(**{field: value})


def test_from_config_rejects_unknown_keys_by_name():
    with pytest.raises(ValueError, match=r"unknown compression settings \['denisty'\]"):
        CompressionConfig.from_config({"denisty": 0.1})


def test_every_contract_name_is_accepted():
    for prune in PRUNE_NAMES:
        for quantize in QUANTIZE_NAMES:
            assert CompressionConfig(prune=prune, quantize=quantize).prune == prune
