"""Delay, loss and sites are real: measured on the wire of a fleet built with vde2 links."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleet_support import leftovers, needs_link_emulation, vde_pids_of

pytestmark = needs_link_emulation

TOLERANCE = 0.10
LOSS_PROFILES = """\
schema_version: 2
profiles:
  lossy:
    description: 5% random loss on the uplink, nothing else (test profile)
    up: {kbit_per_second: 5000, loss_percent: 5}
    down: {kbit_per_second: 20000}
"""


def _measure(fleet, sender: str, receiver: str, *args: str) -> dict:
    completed = fleet.cli("measure", "--from", sender, "--to", receiver, "--json", *args)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_fifty_ms_one_way_delay_is_100_ms_to_the_core_200_between_devices_and_5_percent_loss_is_5(
    test_fleet, tmp_path: Path
):
    # Devices 1 and 2: 50 ms one-way delay on each access link, each way. Device 3: 5% loss up.
    profiles_file = tmp_path / "profiles.yaml"
    profiles_file.write_text(LOSS_PROFILES)
    test_fleet.up(
        "--mix",
        "custom:5:20:50:2,lossy:1",
        "--memory",
        "128",
        "--profiles-file",
        str(profiles_file),
    )
    first, second, lossy = (test_fleet.device(index) for index in (1, 2, 3))
    status = json.loads(test_fleet.cli("status", "--json").stdout)
    assert status["latency_emulated"] and [d["link"] for d in status["devices"]] == ["vde"] * 3
    # The forwarding runs outside every device, in the fleet's emulation cgroup.
    assert status["emulation"]["processes_alive"] == status["emulation"]["processes_recorded"] == 9
    assert status["emulation"]["cgroup"] == f"{test_fleet.prefix}-fleet/emulation"

    to_core = _measure(test_fleet, first, "host", "--probes", "60", "--no-rate")["round_trip"]
    between = _measure(test_fleet, first, second, "--probes", "60", "--seconds", "2.5")
    print(
        f"\nround trip to the core {to_core['round_trip_ms_median']:.1f} ms (expected 100), "
        f"between devices {between['round_trip']['round_trip_ms_median']:.1f} ms (expected 200); "
        f"rate {between['rate']['frame_bits_per_second'] / 1e6:.2f} Mbit/s (shaped 5)"
    )
    assert to_core["round_trip_ms_median"] == pytest.approx(100, rel=TOLERANCE)
    assert between["round_trip"]["round_trip_ms_median"] == pytest.approx(200, rel=TOLERANCE)
    assert abs(to_core["round_trip_relative_error"]) <= TOLERANCE
    # tbf still shapes the rate on the taps.
    assert abs(between["rate"]["relative_error"]) <= 0.15
    assert between["emulation_cpu_cores"] > 0

    # A Gloo timeout no exchange on these links can meet stops `fleet run` before it launches.
    refused = _refused_run(test_fleet, "--model", "lenet", gloo_timeout_seconds="1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS=1 is shorter than a collective may wait" in refused.stderr
    assert "Raise it to at least 30" in refused.stderr and "horovodrun" not in refused.stdout

    lost = _measure(
        test_fleet, lossy, "host", "--probes", "2000", "--interval-ms", "2", "--no-rate"
    )["round_trip"]
    print(
        f"loss up {lost['forward_loss_fraction']:.2%} (profile 5%), back "
        f"{lost['return_loss_fraction']:.2%} (profile 0%) over {lost['probes_sent']} probes"
    )
    assert lost["expected_forward_loss_fraction"] == pytest.approx(0.05)
    assert lost["forward_loss_fraction"] == pytest.approx(0.05, abs=0.02)
    assert lost["return_loss_fraction"] <= 0.01


def _refused_run(fleet, *train_args: str, gloo_timeout_seconds: str):
    fleet.extra_env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = gloo_timeout_seconds
    try:
        return fleet.cli("run", "--", *train_args)
    finally:
        del fleet.extra_env["HOROVOD_GLOO_TIMEOUT_SECONDS"]


def test_down_removes_every_switch_wirefilter_tap_and_namespace_after_a_killed_up(
    test_fleet, assert_clean
):
    test_fleet.up_killed_once(2, "-n", "5", "--profile", "custom:1:2:20", "--memory", "128")
    before = leftovers(test_fleet.prefix, test_fleet.state_dir)
    assert len(before.get("link_emulation", [])) >= 6, before  # 3 processes per device link
    assert len(before.get("namespaces", [])) >= 2 and before.get("links"), before
    down = test_fleet.cli("down")
    assert down.returncode == 0, down.stderr
    assert not vde_pids_of(test_fleet.state_dir)
    assert_clean(test_fleet)


def test_sites_share_one_shaped_delayed_wan_link_each_and_write_the_site_map(test_fleet):
    completed = test_fleet.up("--sites", "2x2", "--wan", "custom:5:20:25", "--memory", "128")
    assert "site site-1" in completed.stdout and "site map:" in completed.stdout
    site_map = (test_fleet.state_dir / "sites.yaml").read_text()
    assert (
        f"site-1: [{test_fleet.address(1)}, {test_fleet.address(2)}]" in site_map
        and f"site-2: [{test_fleet.address(3)}, {test_fleet.address(4)}]" in site_map
    )
    status = json.loads(test_fleet.cli("status", "--json").stdout)
    assert [site["devices"] for site in status["sites"]] == [
        [test_fleet.device(1), test_fleet.device(2)],
        [test_fleet.device(3), test_fleet.device(4)],
    ]
    assert [site["link"] for site in status["sites"]] == ["vde", "vde"]
    # Devices sit on a fast LAN (plain veth); only the site's WAN link is delayed.
    assert {device["link"] for device in status["devices"]} == {"veth"}
    assert "site site-1" in test_fleet.cli("status").stdout

    same_site = _measure(test_fleet, test_fleet.device(1), test_fleet.device(2), "--no-rate")
    across = _measure(test_fleet, test_fleet.device(1), test_fleet.device(3), "--seconds", "2.5")
    assert same_site["round_trip"]["round_trip_ms_median"] < 5
    # Across sites: both WAN links, 25 ms each way each: 100 ms.
    assert across["round_trip"]["round_trip_ms_median"] == pytest.approx(100, rel=TOLERANCE)
    # The 5 Mbit/s WAN uplink of site 1 is the bottleneck, not the 1000 Mbit/s LAN.
    assert across["rate"]["shaped_bits_per_second"] == 5_000_000
    assert abs(across["rate"]["relative_error"]) <= 0.15
    wan = json.loads(test_fleet.cli("status", "--json").stdout)["sites"][0]
    assert sum(q["sent_bytes"] for q in wan["uplink_qdiscs"]) >= across["rate"]["payload_bytes"]
