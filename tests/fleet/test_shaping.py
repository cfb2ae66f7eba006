"""Shaping is real: bulk TCP between two devices runs at the profile's rate, each way."""

from __future__ import annotations

import json

from fleet_support import needs_fleet_system

pytestmark = needs_fleet_system

TOLERANCE = 0.15
TRANSFER_SECONDS = "3.5"


def test_lte_uplink_and_downlink_rates_hold_within_15_percent(test_fleet):
    # Device 1 is on LTE (up 5, down 17.5 Mbit/s), device 2 on fibre (up 20, down 100): each
    # transfer's bottleneck is one direction of the LTE device's link. Rates only (plain veth):
    # the delayed links' rates are checked in test_link_emulation.py.
    test_fleet.up("--mix", "lte:1,fibre:1", "--latency", "off")
    lte, fibre = test_fleet.device(1), test_fleet.device(2)
    results = {}
    for sender, receiver in ((lte, fibre), (fibre, lte)):
        completed = test_fleet.cli(
            "measure", "--from", sender, "--to", receiver, "--seconds", TRANSFER_SECONDS, "--json",
            "--no-round-trip",
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        results[sender] = json.loads(completed.stdout)["rate"]
    uplink, downlink = results[lte], results[fibre]
    assert uplink["shaped_bits_per_second"] == 5_000_000
    assert downlink["shaped_bits_per_second"] == 17_500_000
    for measured in (uplink, downlink):
        assert abs(measured["relative_error"]) <= TOLERANCE, measured
        assert measured["payload_bytes"] > 0.5 * measured["shaped_bits_per_second"] / 8
    print(
        f"\nlte uplink {uplink['frame_bits_per_second'] / 1e6:.3f} Mbit/s (shaped 5, error "
        f"{uplink['relative_error']:+.2%}); lte downlink "
        f"{downlink['frame_bits_per_second'] / 1e6:.3f} Mbit/s (shaped 17.5, error "
        f"{downlink['relative_error']:+.2%})"
    )
    # The qdiscs that did it, read back from tc: the LTE device's uplink queue saw the bulk bytes.
    status = json.loads(test_fleet.cli("status", "--json").stdout)
    lte_status = status["devices"][0]
    assert [
        q["rate_bits_per_second"] for q in lte_status["uplink_qdiscs"] if q["kind"] == "tbf"
    ] == [5_000_000]
    assert [
        q["rate_bits_per_second"] for q in lte_status["downlink_qdiscs"] if q["kind"] == "tbf"
    ] == [17_500_000]
    assert sum(q["sent_bytes"] for q in lte_status["uplink_qdiscs"]) >= uplink["payload_bytes"]
