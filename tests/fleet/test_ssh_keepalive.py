"""The ssh keepalive `fleet up` gives horovodrun's sessions: more misses on slower links."""

from __future__ import annotations

from pathlib import Path

from globaldl.fleet import sshd


def test_misses_grow_with_the_round_trip_so_a_slow_live_device_stays_connected() -> None:
    assert sshd.keepalive_misses(0) == 3
    assert sshd.keepalive_misses(70) == 3  # lte: 0.7 s of slack, under one interval
    assert sshd.keepalive_misses(600) == 3 + 1  # geo satellite: 6 s of slack
    # NB-IoT at 20 s a round trip: 200 s of slack, 40 more keepalives 5 s apart.
    assert sshd.keepalive_misses(20_000) == 3 + 40


def test_the_config_names_every_device_with_its_own_misses() -> None:
    text = sshd.keepalive_config("gdlx", [("10.78.0.2", 0.0), ("10.78.0.3", 20_000.0)])
    assert "Host 10.78.0.2\n    ServerAliveInterval 5\n    ServerAliveCountMax 3\n" in text
    assert "Host 10.78.0.3\n    ServerAliveInterval 5\n    ServerAliveCountMax 43\n" in text
    assert text.startswith("# Written by `globaldl fleet up` (prefix gdlx)")
    assert sshd.keepalive_config_path("gdlx", Path("/x")) == Path("/x/globaldl-fleet-gdlx.conf")
