"""What the links promise, decided before anything runs: wirefilters, paths, sites, timeouts.

No root needed: these build plans and fleet states in memory.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from globaldl.fleet.horovod_link import (
    HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS,
    LinkBudgetError,
    horovod_link_settings,
    link_budget,
)
from globaldl.fleet.paths import HOST, PROBE_FRAME_BYTES, fleet_path
from globaldl.fleet.plan import plan_from_options
from globaldl.fleet.profiles import DEFAULT_PROFILES_PATH, LinkProfile, load_profiles
from globaldl.fleet.shaping import LinkDirection
from globaldl.fleet.sites import parse_sites, read_site_map, site_map_text
from globaldl.fleet.state import DeviceState, FleetState, SiteState
from globaldl.fleet.vde import wire_segments

GIB = 2**30
LENET_DENSE_GRADIENT_BYTES = 246_824


@pytest.fixture(scope="module")
def profiles() -> dict[str, LinkProfile]:
    return load_profiles(DEFAULT_PROFILES_PATH)


def test_equal_constant_delays_share_one_wirefilter_each_way():
    (segment,) = wire_segments(LinkDirection(5000, 50), LinkDirection(20000, 50, loss_percent=5))
    assert segment.wirefilter_options() == ["-d", "LR50", "-d", "RL50", "-l", "RL5"]


def test_jitter_or_unequal_delays_get_one_wirefilter_per_direction_so_queues_never_interact():
    for up, down in (
        (LinkDirection(1000, 12.5, 2.5), LinkDirection(1000, 12.5, 2.5)),
        (LinkDirection(5000, 40), LinkDirection(20000, 10)),
    ):
        first, second = wire_segments(up, down)
        # Each wirefilter queues (delays) one direction only; the other passes unqueued.
        assert [option for option in first.wirefilter_options() if option.startswith("RL")] == []
        assert [option for option in second.wirefilter_options() if option.startswith("LR")] == []
    jittered = wire_segments(LinkDirection(62, 5800, 4200), LinkDirection(26, 5800, 4200))
    assert jittered[0].wirefilter_options() == ["-d", "LR5800+4200U"]
    # Loss alone queues nothing: one wirefilter does both directions.
    assert len(wire_segments(LinkDirection(5000, 40), LinkDirection(5000, 0, loss_percent=1))) == 1


def _state(profile: LinkProfile, devices: int, sites: dict[str, list[int]] | None = None, wan=None):
    """A fleet state as `fleet up` would record it (nothing created on the system)."""
    site_of = {index: name for name, members in (sites or {}).items() for index in members}
    return FleetState(
        prefix="t",
        subnet="10.1.0.0/24",
        bridge="t-br",
        host_address="10.1.0.1",
        state_dir="/nonexistent",
        identity_file="/nonexistent/id",
        emulator="vde2 wirefilter",
        emulator_available=True,
        latency_emulated=True,
        devices=[
            DeviceState(
                name=f"t-{index}",
                address=f"10.1.0.{index + 1}",
                host_interface=f"t-{index}-h",
                profile=profile,
                cpu_cores=0.5,
                memory_bytes=GIB,
                cpu_group="/c",
                memory_group="/m",
                host_key_public="k",
                site=site_of.get(index),
            )
            for index in range(1, devices + 1)
        ],
        sites=[
            SiteState(name, f"t-s{n}", wan, f"t-s{n}-u", f"t-s{n}-w", [f"t-{i}" for i in members])
            for n, (name, members) in enumerate((sites or {}).items(), start=1)
        ],
    )


def test_one_way_delay_is_per_access_link_so_two_devices_see_twice_the_core_round_trip():
    state = _state(LinkProfile("d50", 5000, 20000, up_delay_ms=50, down_delay_ms=50), devices=2)
    to_core = fleet_path(state, "t-1", HOST)
    between = fleet_path(state, "t-1", "t-2")
    serialisation = PROBE_FRAME_BYTES * 8 / 5e6 * 1000 + PROBE_FRAME_BYTES * 8 / 20e6 * 1000
    assert to_core.round_trip_ms() == pytest.approx(100 + serialisation)
    assert between.round_trip_ms() == pytest.approx(200 + 2 * serialisation)
    assert between.rate_bits_per_second == 5_000_000
    assert (between.source_address, between.target_address) == ("10.1.0.2", "10.1.0.3")
    with pytest.raises(ValueError, match="two different endpoints"):
        fleet_path(state, "t-1", "t-1")


def test_a_path_compounds_the_loss_of_every_hop():
    lossy = LinkProfile("lossy", 5000, 5000, up_loss_percent=5, down_loss_percent=10)
    path = fleet_path(_state(lossy, devices=2), "t-1", "t-2")
    assert path.loss_fraction(forward=True) == pytest.approx(1 - 0.95 * 0.90)
    assert fleet_path(_state(lossy, devices=1), "t-1", HOST).loss_fraction() == pytest.approx(0.05)


def test_without_emulation_a_path_promises_rates_only():
    state = _state(LinkProfile("d50", 5000, 20000, up_delay_ms=50, down_delay_ms=50), devices=2)
    state.latency_emulated = False
    assert fleet_path(state, "t-1", HOST).round_trip_ms() < 1


def test_traffic_within_a_site_stays_on_its_lan_and_between_sites_crosses_both_wan_links():
    lan = LinkProfile("lan", 1_000_000, 1_000_000)
    wan = LinkProfile("wan", 5000, 20000, up_delay_ms=25, down_delay_ms=25)
    state = _state(lan, devices=4, sites={"a": [1, 2], "b": [3, 4]}, wan=wan)
    assert fleet_path(state, "t-1", "t-2").round_trip_ms() < 1
    assert fleet_path(state, "t-1", "t-3").round_trip_ms() == pytest.approx(100, abs=1)
    assert fleet_path(state, "t-1", "t-3").rate_bits_per_second == 5_000_000
    assert fleet_path(state, "t-1", HOST).round_trip_ms() == pytest.approx(50, abs=1)


def test_sites_grid_plans_one_lan_bridge_and_one_wan_link_per_site(profiles):
    plan = plan_from_options(
        profiles,
        sites="4x4",
        wan="lte",
        prefix="s",
        available_cores=2,
        available_memory_bytes=64 * GIB,
        force=True,
    )
    assert len(plan.devices) == 16 and [site.name for site in plan.sites] == [
        f"site-{n}" for n in range(1, 5)
    ]
    assert plan.sites[0].devices == ("s-1", "s-2", "s-3", "s-4")
    assert (plan.sites[3].bridge, plan.sites[3].uplink_interface, plan.sites[3].core_interface) == (
        "s-s4",
        "s-s4-u",
        "s-s4-w",
    )
    assert {device.profile.name for device in plan.devices} == {"lan"}
    assert {site.wan.name for site in plan.sites} == {"lte"}
    assert plan.bridge_of(plan.devices[5]) == "s-s2"
    with pytest.raises(ValueError, match="needs --wan PROFILE"):
        plan_from_options(profiles, sites="2x2", available_cores=2, available_memory_bytes=GIB)
    with pytest.raises(ValueError, match="--sites takes --lan"):
        plan_from_options(profiles, sites="2x2", wan="lte", profile="lte")
    with pytest.raises(ValueError, match="--lan and --wan describe sites"):
        plan_from_options(profiles, devices=2, profile="lte", wan="lte")
    with pytest.raises(ValueError, match="does not match --sites 2x2, which makes 4 devices"):
        plan_from_options(profiles, sites="2x2", wan="lte", devices=3)


def test_site_file_names_sites_and_may_give_each_its_own_wan(profiles, tmp_path: Path):
    path = tmp_path / "sites.yaml"
    path.write_text("sites:\n  berlin: 2\n  nairobi: {devices: 1, wan: geo-satellite}\n")
    berlin, nairobi = parse_sites(str(path), profiles, lan="lan", wan="lte")
    assert (berlin.name, berlin.devices, berlin.wan.name) == ("berlin", 2, "lte")
    assert (nairobi.devices, nairobi.wan.name, nairobi.lan.name) == (1, "geo-satellite", "lan")
    path.write_text("sites:\n  berlin: {devices: 2, uplink: lte}\n")
    with pytest.raises(ValueError, match=r"site 'berlin' has unknown keys \['uplink'\]"):
        parse_sites(str(path), profiles, lan="lan", wan="lte")
    path.write_text("sites:\n  berlin: 0\n")
    with pytest.raises(ValueError, match="devices must be at least 1"):
        parse_sites(str(path), profiles, lan="lan", wan="lte")
    with pytest.raises(ValueError, match="neither SITESxDEVICES"):
        parse_sites("four", profiles, lan="lan", wan="lte")


def test_site_map_is_the_contract_document_and_reads_back(tmp_path: Path):
    sites = {"site-1": ["10.1.0.2", "10.1.0.3"], "site-2": ["10.1.0.4"]}
    text = site_map_text(sites)
    assert "sites:\n  site-1: [10.1.0.2, 10.1.0.3]\n" in text
    path = tmp_path / "sites.yaml"
    path.write_text(text)
    assert read_site_map(path) == sites


def test_fleet_site_map_reaches_the_trainers_hierarchy(tmp_path: Path):
    from globaldl.cli.fleet.run import SITES_FILE_ENV, _with_sites_file
    from globaldl.fleet.model_size import parse_train_settings
    from globaldl.fleet.request import TrainRequest
    from globaldl.sites import load_site_map

    fleet_map = tmp_path / "sites.yaml"
    fleet_map.write_text(site_map_text({"site-1": ["10.1.0.2"], "site-2": ["10.1.0.3"]}))
    # The trainer's reader finds a device by the address horovodrun launched it under.
    assert load_site_map(fleet_map).site_of(["dev2", "10.1.0.3"]) == "site-2"
    # `fleet run -- --hierarchy sites` is valid before the flag is added: the map is in the env.
    environ = {SITES_FILE_ENV: str(fleet_map)}
    summary = tmp_path / "summary.json"
    request = TrainRequest(("--hierarchy", "sites"), run_id="r", summary_path=summary)
    settings = parse_train_settings(request.train_args, environ)
    assert settings.hierarchy == "sites"
    passed = _with_sites_file(request, settings).train_args
    assert passed == ("--hierarchy", "sites", "--sites-file", str(fleet_map))
    # A map the user chose is kept.
    own_map = tmp_path / "own.yaml"
    own_map.write_text("sites:\n  home: [10.1.0.2, 10.1.0.3]\n")
    own = TrainRequest(("--sites-file", str(own_map)), run_id="r", summary_path=summary)
    assert _with_sites_file(own, parse_train_settings(own.train_args, environ)) == own


def _settings(budget, **overrides):
    options = {
        "dense_gradient_bytes": LENET_DENSE_GRADIENT_BYTES,
        "compressed": False,
        "environ": {},
        "start_timeout_seconds": None,
        "default_start_timeout_seconds": 60,
        "run_timeout_seconds": 3600,
        "horovod_edits_installed": ("ssh-check-connect-timeout",),
    }
    return horovod_link_settings(budget, **{**options, **overrides})


def test_fast_links_keep_horovods_default_gloo_timeout(profiles):
    state = _state(profiles["lte"], devices=4)
    settings = _settings(link_budget(state, [d.name for d in state.devices]))
    assert settings.gloo_timeout_seconds == HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS
    assert settings.cycle_time_ms == 5  # the measured rule for a 5 Mbit/s uplink
    assert settings.dense_exchange_seconds == pytest.approx(1.06, abs=0.1)


def test_nb_iot_dense_lenet_gets_timeouts_covering_minutes_per_exchange(profiles):
    state = _state(profiles["nb-iot"], devices=4)
    budget = link_budget(state, [d.name for d in state.devices])
    settings = _settings(budget)
    # 1.5 x 246,824 B through 26 kbit/s is ~119 s; six rounds of 11.6 s one-way on top.
    assert settings.dense_exchange_seconds == pytest.approx(119 + 6 * 11.6, rel=0.05)
    assert settings.gloo_timeout_seconds >= 3 * settings.dense_exchange_seconds
    assert settings.cycle_time_ms == 1000
    # 40 round trips of 11.6 s to the host.
    assert settings.start_timeout_seconds >= 60 + 40 * 11.6
    assert settings.environment()["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(
        settings.gloo_timeout_seconds
    )


def test_horovodruns_ssh_check_waits_for_an_nb_iot_round_trip_or_the_run_is_refused(profiles):
    fast = _settings(link_budget(*_budget_args(_state(profiles["lte"], devices=2))))
    assert fast.environment()["GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS"] == "10"  # Horovod's own
    nb_iot = link_budget(*_budget_args(_state(profiles["nb-iot"], devices=2)))
    # Two round trips of ~12 s to the host and 3 s: Horovod's fixed 10 s cannot even connect.
    assert nb_iot.worst_host_round_trip_ms > 10_000
    settings = _settings(nb_iot)
    assert settings.ssh_connect_timeout_seconds == 3 + math.ceil(
        2 * nb_iot.worst_host_round_trip_ms / 1000
    )
    assert settings.environment()["GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS"] == str(
        settings.ssh_connect_timeout_seconds
    )
    assert any("for horovodrun's ssh check" in note for note in settings.notes)
    # A user's own value is kept, and a Horovod without the edit cannot honour any longer wait.
    kept = _settings(nb_iot, environ={"GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS": "60"})
    assert kept.ssh_connect_timeout_seconds == 60
    with pytest.raises(LinkBudgetError, match="lacks the edit .*ssh-check-connect-timeout"):
        _settings(nb_iot, horovod_edits_installed=("gloo-process-set-interface",))
    assert (
        _settings(
            link_budget(*_budget_args(_state(profiles["lte"], devices=2))),
            horovod_edits_installed=(),
        ).ssh_connect_timeout_seconds
        == 10
    )
    with pytest.raises(ValueError, match="GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS must be a whole"):
        _settings(nb_iot, environ={"GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS": "soon"})


def _budget_args(state):
    return state, [device.name for device in state.devices]


def test_a_gloo_timeout_too_short_for_a_dense_exchange_is_refused_with_the_numbers(profiles):
    state = _state(profiles["nb-iot"], devices=4)
    budget = link_budget(state, [d.name for d in state.devices])
    with pytest.raises(
        LinkBudgetError, match="HOROVOD_GLOO_TIMEOUT_SECONDS=30 is shorter"
    ) as raised:
        _settings(budget, environ={"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"})
    assert "246,824 gradient bytes across 4 devices takes ~" in str(raised.value)
    kept = _settings(budget, environ={"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"}, compressed=True)
    assert kept.gloo_timeout_seconds == 30
    assert any("kept, as compressed" in note for note in kept.notes)
    with pytest.raises(LinkBudgetError, match="longer than the run may last"):
        _settings(budget, run_timeout_seconds=60)
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME must be a number"):
        _settings(budget, environ={"HOROVOD_CYCLE_TIME": "fast"})


def test_without_link_emulation_auto_warns_loudly_and_require_refuses(profiles, monkeypatch):
    from globaldl.fleet import fleet as fleet_module
    from globaldl.fleet.fleet import Fleet, LinkEmulationUnavailableError

    monkeypatch.setattr(fleet_module.vde, "availability", lambda: (False, "vde_switch not found"))
    plan = plan_from_options(
        profiles, devices=1, profile="lte", available_cores=2, available_memory_bytes=GIB
    )
    warnings: list[str] = []
    assert Fleet(Path("/nonexistent"))._check_link_emulation(plan, "auto", warnings.append) == (
        False,
        "vde_switch not found",
    )
    assert "WARNING: link emulation is unavailable (vde_switch not found)" in warnings[0]
    assert "Delay, jitter and loss of lte are NOT emulated" in warnings[0]
    with pytest.raises(LinkEmulationUnavailableError, match="--latency auto or off"):
        Fleet(Path("/nonexistent"))._check_link_emulation(plan, "require", warnings.append)
    with pytest.raises(ValueError, match="latency 'sometimes' is not one of: auto, require, off"):
        Fleet(Path("/nonexistent"))._check_link_emulation(plan, "sometimes", warnings.append)
