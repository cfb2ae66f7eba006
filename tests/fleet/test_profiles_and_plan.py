"""Link profiles as data, and fleet plans that fit the machine (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from globaldl.fleet.launcher import ElasticOptions, horovodrun_argv
from globaldl.fleet.plan import kernel_congestion_controls, plan_fleet
from globaldl.fleet.profiles import (
    DEFAULT_PROFILES_PATH,
    LinkProfile,
    device_profiles,
    load_profiles,
    parse_mix,
    resolve_profile,
)
from globaldl.fleet.shaping import LinkDirection, shaping_command
from globaldl.fleet.state import DeviceState

GIB = 2**30


@pytest.fixture(scope="module")
def profiles() -> dict[str, LinkProfile]:
    return load_profiles(DEFAULT_PROFILES_PATH)


def test_profiles_file_holds_cited_figures_with_narrow_cellular_uplinks(profiles):
    assert {
        "lan", "fibre", "lte", "slow-4g", "lte-m", "nb-iot", "geo-satellite", "intercontinental"
    } <= set(profiles)  # fmt: skip
    assert all(profile.source for profile in profiles.values())
    assert (profiles["fibre"].down_kbit_per_second, profiles["fibre"].up_kbit_per_second) == (
        100_000,
        20_000,
    )
    assert (profiles["lte"].up_kbit_per_second, profiles["lte"].down_kbit_per_second) == (
        5000,
        17500,
    )
    # Published round trips: WebPageTest LTE 70 ms, Lighthouse slow 4G 150 ms, GEO ~600 ms.
    assert profiles["lte"].core_round_trip_ms == 70
    assert profiles["slow-4g"].core_round_trip_ms == 150
    assert profiles["geo-satellite"].core_round_trip_ms == 600
    assert (profiles["slow-4g"].down_kbit_per_second, profiles["slow-4g"].up_kbit_per_second) == (
        1600,
        750,
    )
    assert profiles["lte-m"].down_kbit_per_second == profiles["lte-m"].up_kbit_per_second == 1000
    nb_iot = profiles["nb-iot"]
    assert (nb_iot.down_kbit_per_second, nb_iot.up_kbit_per_second) == (26, 62)
    # NB-IoT latency 1.6-10 s across coverage conditions: a device gets the middle, each way.
    assert nb_iot.up_delay_ms == nb_iot.down_delay_ms == (1600 + 10_000) / 2
    # Two sites meet at the core: each site's link carries half the site-to-site round trip.
    assert 2 * profiles["intercontinental"].core_round_trip_ms == 170
    for name in ("lte", "slow-4g", "geo-satellite"):
        assert profiles[name].up_kbit_per_second < profiles[name].down_kbit_per_second
    assert not profiles["lan"].impaired
    assert all(profile.impaired for name, profile in profiles.items() if name != "lan")


def test_profile_config_round_trips(profiles):
    for profile in profiles.values():
        assert LinkProfile.from_config(profile.get_config()) == profile


def test_unknown_profile_names_the_valid_ones(profiles):
    with pytest.raises(
        ValueError,
        match="unknown profile 'wifi'.*fibre, geo-satellite, intercontinental, lan, lte, lte-m, "
        "nb-iot, slow-4g, custom",
    ):
        resolve_profile("wifi", profiles)


def test_custom_profile_from_flags_or_spec_has_no_delay_unless_a_third_field_gives_it(profiles):
    from_flags = resolve_profile("custom", profiles, up_mbit=5, down_mbit=20)
    from_spec = resolve_profile("custom:5:20", profiles)
    assert from_flags == from_spec
    assert (from_spec.up_kbit_per_second, from_spec.down_kbit_per_second) == (5000, 20000)
    assert not from_spec.impaired
    delayed = resolve_profile("custom:5:20:50", profiles)
    assert delayed.name == "custom:5:20:50"
    assert (delayed.up_delay_ms, delayed.down_delay_ms) == (50, 50)
    assert delayed.rates_only() == LinkProfile(
        "custom:5:20:50", 5000, 20000, description=delayed.description
    )
    with pytest.raises(ValueError, match="one-way delay must be >= 0 ms"):
        resolve_profile("custom:5:20:-1", profiles)
    with pytest.raises(ValueError, match=r"custom:UP_MBIT:DOWN_MBIT\[:ONE_WAY_DELAY_MS\]"):
        resolve_profile("custom:5:20:50:7", profiles)
    with pytest.raises(ValueError, match="needs both --up-mbit and --down-mbit"):
        resolve_profile("custom", profiles, up_mbit=5)
    with pytest.raises(ValueError, match="custom:UP_MBIT:DOWN_MBIT"):
        resolve_profile("custom:5", profiles)
    with pytest.raises(ValueError, match="up_mbit must be a positive"):
        resolve_profile("custom:0:5", profiles)


def test_mix_expands_in_order_and_checks_counts(profiles):
    mixed = parse_mix("lte:2,slow-4g:1,custom:5:20:1,custom:5:20:50:1", profiles)
    assert [p.name for p in mixed] == ["lte", "lte", "slow-4g", "custom:5:20", "custom:5:20:50"]
    with pytest.raises(ValueError, match="count must be at least 1"):
        parse_mix("lte:0", profiles)
    with pytest.raises(ValueError, match="expected PROFILE:COUNT"):
        parse_mix("lte", profiles)
    with pytest.raises(ValueError, match="does not match --mix"):
        device_profiles(profiles, devices=3, mix="lte:2")


def test_zero_devices_is_refused(profiles):
    with pytest.raises(ValueError, match="--devices must be at least 1, got 0"):
        device_profiles(profiles, devices=0, profile="lte")


def test_bad_profiles_file_names_the_bad_key(tmp_path: Path):
    path = tmp_path / "profiles.yaml"
    path.write_text(
        "schema_version: 2\nprofiles:\n  x:\n    up: {kbit_per_second: 1}\n"
        "    down: {kbit_per_second: 1, latency: 3}\n"
    )
    with pytest.raises(ValueError, match=r"profile 'x' down has unknown keys \['latency'\]"):
        load_profiles(path)
    path.write_text(
        "schema_version: 2\nprofiles:\n  x:\n    up: {kbit_per_second: -1}\n"
        "    down: {kbit_per_second: 1}\n"
    )
    with pytest.raises(ValueError, match="up_kbit_per_second must be a positive number"):
        load_profiles(path)
    path.write_text(
        "schema_version: 2\nprofiles:\n  x:\n    up: {kbit_per_second: 1, delay_ms: 5, "
        "jitter_ms: 9}\n    down: {kbit_per_second: 1}\n"
    )
    with pytest.raises(ValueError, match=r"up_jitter_ms \(9\) must not exceed up_delay_ms \(5\)"):
        load_profiles(path)
    path.write_text("schema_version: 1\nprofiles: {}\n")
    with pytest.raises(ValueError, match="schema_version must be 2"):
        load_profiles(path)


def test_schema_1_profiles_in_old_results_still_load_with_one_value_for_both_directions():
    old = {
        "name": "lte",
        "up_kbit_per_second": 5000,
        "down_kbit_per_second": 17500,
        "one_way_latency_ms": 32.5,
        "jitter_ms": 2.5,
        "loss_percent": 0,
        "description": "",
    }
    profile = LinkProfile.from_config(old)
    assert (profile.up_delay_ms, profile.down_delay_ms) == (32.5, 32.5)
    assert (profile.up_jitter_ms, profile.down_jitter_ms) == (2.5, 2.5)


def test_default_cpu_splits_the_machine_evenly(profiles):
    plan = plan_fleet([profiles["lte"]] * 8, available_cores=2, available_memory_bytes=16 * GIB)
    assert [device.cpu_cores for device in plan.devices] == [0.25] * 8
    assert plan.total_cpu_cores == pytest.approx(2)
    assert [d.address for d in plan.devices][:2] == ["10.77.0.2", "10.77.0.3"]
    assert plan.host_address == "10.77.0.1"
    assert len({d.name for d in plan.devices}) == 8


def test_cpu_total_above_the_machine_is_refused_unless_forced(profiles):
    with pytest.raises(
        ValueError,
        match=r"4 devices with 1\+1\+1\+1 = 4 cores is more than this machine's 2.*--force",
    ):
        plan_fleet(
            [profiles["lte"]] * 4, cpu_cores=1, available_cores=2, available_memory_bytes=16 * GIB
        )
    forced = plan_fleet(
        [profiles["lte"]] * 4,
        cpu_cores=1,
        force=True,
        available_cores=2,
        available_memory_bytes=16 * GIB,
    )
    assert forced.total_cpu_cores == 4


def test_each_device_can_have_its_own_cpu_share(profiles):
    plan = plan_fleet(
        [profiles["lte"]] * 4,
        cpu_cores_each=[0.8, 0.8, 0.2, 0.2],
        available_cores=2,
        available_memory_bytes=16 * GIB,
    )
    assert [device.cpu_cores for device in plan.devices] == [0.8, 0.8, 0.2, 0.2]
    with pytest.raises(ValueError, match=r"one value per device \(4\), got 3: 0.8,0.8,0.2"):
        plan_fleet([profiles["lte"]] * 4, cpu_cores_each=[0.8, 0.8, 0.2], available_cores=2)
    with pytest.raises(ValueError, match="not both"):
        plan_fleet([profiles["lte"]] * 2, cpu_cores=0.5, cpu_cores_each=[0.5, 0.5])


def test_a_congestion_control_must_be_one_the_kernel_offers(profiles, tmp_path: Path):
    offered = ["reno", "bbr", "cubic"]
    plan = plan_fleet(
        [profiles["lte"]],
        congestion_control="cubic",
        available_congestion_controls=offered,
        available_cores=2,
        available_memory_bytes=GIB,
    )
    assert plan.congestion_control == "cubic"
    default = plan_fleet([profiles["lte"]], available_cores=2, available_memory_bytes=GIB)
    assert default.congestion_control is None  # the namespaces keep the host's default
    with pytest.raises(
        ValueError,
        match=r"--congestion-control 'vegas' is not offered by this kernel; "
        r"available: reno, bbr, cubic",
    ):
        plan_fleet(
            [profiles["lte"]],
            congestion_control="vegas",
            available_congestion_controls=offered,
            available_cores=2,
            available_memory_bytes=GIB,
        )
    listing = tmp_path / "tcp_available_congestion_control"
    listing.write_text("reno cubic\n")
    assert kernel_congestion_controls(listing) == ["reno", "cubic"]
    assert kernel_congestion_controls(tmp_path / "missing") == []


def test_memory_total_above_the_machine_is_refused(profiles):
    with pytest.raises(ValueError, match="more than this machine's 1024 MB"):
        plan_fleet(
            [profiles["lte"]] * 2, memory_mb=768, available_cores=2, available_memory_bytes=GIB
        )


def test_plan_rejects_bad_names_and_small_subnets(profiles):
    with pytest.raises(ValueError, match="prefix must be"):
        plan_fleet(
            [profiles["lte"]], prefix="Bad-Prefix", available_cores=2, available_memory_bytes=GIB
        )
    with pytest.raises(ValueError, match="has room for 1 devices"):
        plan_fleet(
            [profiles["lte"]] * 3,
            subnet="10.9.9.0/30",
            available_cores=2,
            available_memory_bytes=GIB,
        )


def test_tbf_shapes_the_rate_of_a_direction_inside_its_namespace():
    command = shaping_command("eth0", LinkDirection(5000, delay_ms=35), "ns1")
    assert command[:3] == ["tc", "-n", "ns1"]
    assert command[command.index("tbf") + 1 : command.index("tbf") + 3] == ["rate", "5000000bit"]
    assert "netem" not in command


def _device(name: str, address: str) -> DeviceState:
    return DeviceState(
        name=name,
        address=address,
        host_interface=f"{name}-h",
        profile=LinkProfile("p", 1, 1),
        cpu_cores=1,
        memory_bytes=GIB,
        cpu_group="/c",
        memory_group="/m",
        host_key_public="ssh-ed25519 AAAA",
    )


def test_horovodrun_command_lists_one_slot_per_device_and_the_fleet_key():
    argv = horovodrun_argv(
        [_device("a-1", "10.1.0.2"), _device("a-2", "10.1.0.3")],
        Path("/run/x/ssh/id"),
        ["python", "t.py"],
    )
    assert argv[argv.index("-H") + 1] == "10.1.0.2:1,10.1.0.3:1"
    assert argv[argv.index("-np") + 1] == "2"
    assert argv[argv.index("--ssh-identity-file") + 1] == "/run/x/ssh/id"
    assert "--gloo" in argv and argv[-2:] == ["python", "t.py"]
    with pytest.raises(ValueError, match="no live devices"):
        horovodrun_argv([], Path("/k"), ["x"])


def test_elastic_horovodrun_command_uses_discovery_and_bounded_waits():
    argv = horovodrun_argv(
        [_device("a-1", "10.1.0.2"), _device("a-2", "10.1.0.3")],
        Path("/run/x/ssh/id"),
        ["globaldl", "train", "--elastic"],
        elastic=ElasticOptions(min_np=1, max_np=3, elastic_timeout_seconds=45),
        discovery=Path("/run/x/discover-hosts.sh"),
    )
    assert "-H" not in argv
    assert argv[argv.index("--host-discovery-script") + 1] == "/run/x/discover-hosts.sh"
    assert argv[argv.index("--min-np") + 1] == "1" and argv[argv.index("--max-np") + 1] == "3"
    assert argv[argv.index("--elastic-timeout") + 1] == "45"
    cooldown = argv.index("--blacklist-cooldown-range")
    assert argv[cooldown + 1 : cooldown + 3] == ["5", "10"]
    with pytest.raises(ValueError, match="min_np 3 and max_np 2"):
        ElasticOptions(min_np=3, max_np=2)
    with pytest.raises(ValueError, match="needs a host-discovery script"):
        horovodrun_argv(
            [_device("a-1", "10.1.0.2")], Path("/k"), ["x"], elastic=ElasticOptions(1, 1)
        )
