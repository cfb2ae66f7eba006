"""The fleet's byte accounting: counters against the collectives' algorithms (no root needed)."""

from __future__ import annotations

import pytest

from globaldl.collectives import GLOO_PREAMBLE_BYTES, CollectiveLedger
from globaldl.fleet.accounting import account_bytes
from globaldl.fleet.coordination import HEADER_BYTES_PER_PACKET, Calibration, IdleCoordination

ZERO = {"tx_bytes": 0, "rx_bytes": 0, "tx_packets": 0, "rx_packets": 0}
DEVICES = ["d1", "d2", "d3", "d4"]
WIRE_PER_STEP, STEPS = 2_502, 10
COMPRESSED = {"prune": "topk", "density": 0.01, "quantize": "int8", "error_feedback": True}
DENSE = {"prune": "none", "density": 0.01, "quantize": "none", "error_feedback": True}


def _counters(tx: int, packets: int = 0) -> dict[str, int]:
    return {"tx_bytes": tx, "rx_bytes": 0, "tx_packets": packets, "rx_packets": 0}


def _summary(compression: dict, **extra: object) -> dict:
    return {
        "gradient_bytes_wire": WIRE_PER_STEP * STEPS,
        "steps": STEPS,
        "ranks": 4,
        "compression": compression,
        "devices": DEVICES,
        **extra,
    }


def _account(summary: dict, tx: int = 1_000_000, **options: object):
    before = {name: ZERO for name in DEVICES}
    after = {name: _counters(tx, packets=1_000) for name in DEVICES}
    return account_bytes(before, after, summary, run_seconds=20.0, **options)


def test_compressed_payloads_are_accounted_with_the_allgather_factor_not_the_ring_one():
    accounting = _account(_summary(COMPRESSED))
    assert accounting.run.combine == "gather"
    assert accounting.to_dict()["tx_bytes_per_wire_byte"] == 3
    # Each rank's payload reaches the 3 others: 3 sends and 3 receives per step, each framed.
    framing = STEPS * GLOO_PREAMBLE_BYTES * (2 * 3 + 3)
    for device in accounting.devices:
        assert device.gradient_tx_bytes == 3 * WIRE_PER_STEP * STEPS + framing
    assert "ring allgather, N-1" in accounting.report()


def test_dense_payloads_are_accounted_with_the_ring_allreduce_factor():
    accounting = _account(_summary(DENSE))
    assert accounting.to_dict()["tx_bytes_per_wire_byte"] == 1.5
    payloads = [d.gradient_tx_bytes for d in accounting.devices]
    mean_payload_and_framing = sum(payloads) / len(payloads)
    # 12 segments sent and 12 received per step and rank on 4 ranks (8 segments, 6 per phase).
    framing = STEPS * GLOO_PREAMBLE_BYTES * (2 * 12 + 12)
    assert mean_payload_and_framing == pytest.approx(1.5 * WIRE_PER_STEP * STEPS + framing)


def test_the_exchange_object_decides_the_combine_over_the_compression_settings():
    summary = _summary(
        DENSE, exchange={"combine": "gather", "collectives_per_step": 2, "hierarchy": "none"}
    )
    accounting = _account(summary)
    # Two allgathers per step: the 4-byte length first, then the payload (2,498 bytes).
    per_step = 3 * WIRE_PER_STEP + 2 * GLOO_PREAMBLE_BYTES * (2 * 3 + 3)
    assert accounting.devices[0].gradient_tx_bytes == STEPS * per_step


def test_headers_come_from_packet_counts_and_the_rest_is_payload():
    accounting = _account(_summary(COMPRESSED), tx=500_000)
    device = accounting.devices[0]
    assert device.measured.header_tx_bytes == HEADER_BYTES_PER_PACKET * 1_000
    assert device.measured.payload_tx_bytes == 500_000 - HEADER_BYTES_PER_PACKET * 1_000


def test_each_rank_sends_its_own_share_of_the_broadcast_and_its_own_log_lines():
    ledger = CollectiveLedger()
    ledger.record("broadcast", 100_000, 4)
    summary = _summary(
        COMPRESSED, traffic={"collectives_outside_steps": [c.to_dict() for c in ledger.calls()]}
    )
    accounting = _account(summary, log_bytes_by_rank={0: 700, 3: 50})
    collectives = {d.device: d.collectives_tx_bytes for d in accounting.devices}
    # Binomial tree from rank 0 on 4 ranks: 0 -> 1, 0 -> 2, 1 -> 3.
    assert collectives["d1"] == 2 * 100_000 + 2 * 2 * GLOO_PREAMBLE_BYTES
    assert collectives["d2"] == 100_000 + GLOO_PREAMBLE_BYTES * (2 + 1)
    assert collectives["d3"] == collectives["d4"] == GLOO_PREAMBLE_BYTES
    assert [d.log_tx_bytes for d in accounting.devices] == [700, 0, 0, 50]


def _calibration(cycle_time_ms: float = 50.0, ranks: int = 4) -> Calibration:
    return Calibration(
        launch_payload_bytes=7_000,
        idle=IdleCoordination(
            ranks=ranks,
            cycle_time_ms=cycle_time_ms,
            tx_bytes_per_second=(9_000.0,) * ranks,
            payload_bytes_per_second=(3_000.0,) * ranks,
            tx_packets_per_second=(90.0,) * ranks,
            init_payload_bytes=(12_000,) * ranks,
            cycles_per_second=10.0,
        ),
    )


def test_with_a_calibration_the_accounting_says_what_is_left_unexplained():
    summary = _summary(
        COMPRESSED, exchange={"combine": "gather", "horovod_started_unix_seconds": 100.0}
    )
    accounting = _account(
        summary, summary_written_unix_seconds=120.0, cycle_time_ms=50.0, calibration=_calibration()
    )
    device = accounting.devices[0]
    assert accounting.coordination_seconds == 20.0
    assert device.coordination_tx_bytes_model == 3_000 * 20
    expected = (
        HEADER_BYTES_PER_PACKET * 1_000 + device.gradient_tx_bytes + 7_000 + 12_000 + 3_000 * 20
    )
    assert device.model_tx_bytes == pytest.approx(expected)
    assert device.unexplained_tx_bytes == pytest.approx(1_000_000 - expected)
    assert accounting.unexplained_tx_bytes == pytest.approx(1_000_000 - expected)


def test_on_delayed_links_coordination_counts_at_most_one_cycle_per_round_trip():
    summary = _summary(
        COMPRESSED, exchange={"combine": "gather", "horovod_started_unix_seconds": 100.0}
    )
    options = {"summary_written_unix_seconds": 120.0, "cycle_time_ms": 50.0}

    def coordination(round_trip_seconds: float) -> float | None:
        accounting = _account(
            summary, calibration=_calibration(), round_trip_seconds=round_trip_seconds, **options
        )
        return accounting.devices[0].coordination_tx_bytes_model

    # The calibration ran 10 cycles a second (300 B each): a 0.4 s round trip allows 2.5.
    assert coordination(0.4) == pytest.approx(300 * 2.5 * 20)
    # A round trip shorter than the calibrated cycle changes nothing.
    assert coordination(0.05) == coordination(0.0) == 3_000 * 20
    with pytest.raises(ValueError, match="round_trip_seconds must be >= 0, got -1"):
        coordination(-1.0)


def test_a_calibration_for_another_cycle_time_is_not_used_and_the_report_says_so():
    summary = _summary(
        COMPRESSED, exchange={"combine": "gather", "horovod_started_unix_seconds": 100.0}
    )
    accounting = _account(
        summary, summary_written_unix_seconds=120.0, cycle_time_ms=5.0, calibration=_calibration()
    )
    assert accounting.calibration is None and accounting.unexplained_tx_bytes is None
    assert "measured on 4 devices at 50 ms does not match" in accounting.report()
    # Without it, what lies beyond the run's own data is reported per second of Horovod.
    rate = accounting.coordination_payload_bytes_per_second
    device = accounting.devices[0]
    assert rate == pytest.approx(
        (device.measured.payload_tx_bytes - device.known_payload_tx_bytes) / 20.0
    )


def test_a_one_device_run_sends_no_gradients_and_still_reports():
    accounting = account_bytes(
        {"d1": ZERO},
        {"d1": _counters(5_000, packets=5)},
        {"gradient_bytes_wire": 1_000, "steps": 1, "ranks": 1, "devices": ["d1"]},
        run_seconds=1,
    )
    assert accounting.devices[0].gradient_tx_bytes == 0
    assert accounting.to_dict()["tx_bytes_per_wire_byte"] == 0
    assert "d1" in accounting.report()


def test_counters_of_different_devices_and_a_bare_summary_are_refused():
    with pytest.raises(ValueError, match="cover different devices"):
        account_bytes({"d1": ZERO}, {"d2": ZERO}, _summary(COMPRESSED))
    with pytest.raises(ValueError, match="lacks 'gradient_bytes_wire'"):
        account_bytes({"d1": ZERO}, {"d1": ZERO}, {"steps": 1, "ranks": 2})
