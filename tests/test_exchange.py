"""The exchange obeys the compressor's wire declaration and refuses one it cannot honour."""

from __future__ import annotations

import pytest
import tensorflow as tf

from globaldl.compression import (
    Combine,
    CompressionConfig,
    GradientCompressor,
    WireSpec,
)
from globaldl.exchange import (
    WireSpecError,
    check_payload,
    check_wire_spec,
    collectives_per_step,
    dense_device_tx_bytes_per_step_model,
    device_tx_bytes_per_step_model,
)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (WireSpec(Combine.SUM, "int16", (64,)), "dtype='int16' cannot be summed"),
        (WireSpec(Combine.SUM, "bool", (8,)), "dtype='bool' cannot be summed"),
        (WireSpec(Combine.GATHER, "uint8", (10, 10)), "GATHER over 2 rounds"),
        (WireSpec(Combine.SUM, "float32", (6,)), "not a whole number of float32 elements"),
        (WireSpec(Combine.SUM, "float32", (-4,)), "length -4 is not a byte count"),
        (WireSpec(Combine.SUM, "float32", ()), "declares no payload"),
        (WireSpec("sum", "float32", (4,)), "combine='sum' is not one of"),  # type: ignore[arg-type]
    ],
)
def test_the_exchange_refuses_an_inconsistent_declaration(spec: WireSpec, message: str) -> None:
    with pytest.raises(WireSpecError, match=message):
        check_wire_spec(spec)


def test_a_payload_that_breaks_its_declaration_is_refused_when_traced() -> None:
    spec = WireSpec(Combine.SUM, "float16", (8,))
    assert check_payload(tf.zeros([4], tf.float16), spec) == 8
    with pytest.raises(WireSpecError, match="does not match its declaration: a 1-D float16"):
        check_payload(tf.zeros([4], tf.float32), spec)
    with pytest.raises(WireSpecError, match="declared fixed length of 8 bytes"):
        check_payload(tf.zeros([5], tf.float16), spec)


@pytest.mark.parametrize(
    ("prune", "quantize"),
    [
        ("none", "none"),
        ("none", "fp16"),
        ("topk", "int8"),
        ("threshold", "sign"),  # a length that varies
        ("shared-topk", "intsum"),
        ("powersgd", "fp16"),
    ],
)
def test_every_codec_declares_what_its_payload_is(prune: str, quantize: str) -> None:
    variables = [tf.Variable(tf.zeros([60, 40])), tf.Variable(tf.zeros([7]))]
    compressor = GradientCompressor(
        CompressionConfig(prune=prune, quantize=quantize), variables, steps_per_epoch=5
    )
    spec = check_wire_spec(compressor.wire_spec)
    payload, _ = compressor.compress([tf.ones([60, 40]), tf.ones([7])], tf.constant(0, tf.int64))
    assert check_payload(payload, spec) == spec.round_bytes[0]
    if spec.fixed_length:
        assert int(compressor.wire_bytes(payload)) == spec.round_bytes[0]


def test_collectives_and_traffic_follow_the_declaration_alone() -> None:
    summed = WireSpec(Combine.SUM, "float32", (400,))
    fixed = WireSpec(Combine.GATHER, "uint8", (100,))
    varying = WireSpec(Combine.GATHER, "uint8", (None,))
    assert [collectives_per_step(s) for s in (summed, fixed, varying)] == [1, 1, 2]
    # ring allreduce: 2 (N - 1) / N x payload; ring allgather: (N - 1) x payload
    assert device_tx_bytes_per_step_model(summed, 16, 400) == pytest.approx(750.0)
    assert device_tx_bytes_per_step_model(fixed, 16, 100) == pytest.approx(1500.0)
    assert device_tx_bytes_per_step_model(fixed, 1, 100) == 0.0
    assert dense_device_tx_bytes_per_step_model(4000, 2) == pytest.approx(4000.0)
