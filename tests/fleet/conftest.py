"""Fixtures for fleet tests: a uniquely named fleet, always brought down and checked clean."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_support import (
    KNOWN_HOSTS,
    SKIP_REASON,
    FleetUnderTest,
    force_clean,
    free_subnet,
    leftovers,
    read_text_or_none,
)


@pytest.fixture()
def test_fleet() -> Iterator[FleetUnderTest]:
    """A unique prefix/subnet/state dir; always brought down (and checked clean) afterwards."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    prefix = f"gt{secrets.token_hex(2)}"
    fleet = FleetUnderTest(
        prefix=prefix, subnet=free_subnet(), state_dir=Path(f"/run/gdl-test-{prefix}")
    )
    try:
        yield fleet
    finally:
        down = fleet.cli("down")
        left = leftovers(prefix, fleet.state_dir)
        # Only this fleet's host keys: other fleets on the machine share the same known_hosts.
        known_hosts = read_text_or_none(KNOWN_HOSTS) or ""
        kept = [key for key in fleet.host_keys if key in known_hosts]
        if kept:
            left["known_hosts"] = [f"{KNOWN_HOSTS} still holds {len(kept)} of its host keys"]
        if left:
            force_clean(prefix, fleet.state_dir)
        assert down.returncode == 0, f"fleet down failed in teardown:\n{down.stdout}\n{down.stderr}"
        assert not left, f"fleet down left behind: {left}"


@pytest.fixture()
def assert_clean() -> Callable[[FleetUnderTest], None]:
    """Assert that nothing of a test fleet remains on the machine."""

    def check(fleet: FleetUnderTest) -> None:
        left = leftovers(fleet.prefix, fleet.state_dir)
        assert not left, f"left behind: {left}"

    return check
