"""The two Gloo timeouts of elastic runs: read from the environment, stretched for slow steps."""

from __future__ import annotations

import pytest

from globaldl.elastic_timeouts import (
    COLLECTIVE_TIMEOUT_ENV,
    HOROVOD_TIMEOUT_ENV,
    JOIN_TIMEOUT_ENV,
    GlooTimeouts,
    use_gloo_timeouts,
)


def test_defaults_are_a_long_join_and_a_short_collective_timeout() -> None:
    timeouts = GlooTimeouts.from_env({})
    assert timeouts.join_seconds == 60
    assert timeouts.collective_seconds == 10


def test_a_bare_horovod_timeout_is_the_join_timeout_and_ours_override_it() -> None:
    assert GlooTimeouts.from_env({HOROVOD_TIMEOUT_ENV: "45"}).join_seconds == 45
    timeouts = GlooTimeouts.from_env(
        {HOROVOD_TIMEOUT_ENV: "45", JOIN_TIMEOUT_ENV: "90", COLLECTIVE_TIMEOUT_ENV: "8"}
    )
    assert (timeouts.join_seconds, timeouts.collective_seconds) == (90, 8)


@pytest.mark.parametrize("value", ["0", "-3", "ten", "1.5"])
def test_a_bad_timeout_names_the_variable_and_the_value(value: str) -> None:
    with pytest.raises(ValueError, match=f"{COLLECTIVE_TIMEOUT_ENV}.*{value}"):
        GlooTimeouts.from_env({COLLECTIVE_TIMEOUT_ENV: value})


def test_fast_steps_keep_the_configured_collective_timeout() -> None:
    assert GlooTimeouts(60, 10).safe_collective_seconds(0.2) == 10


def test_slow_steps_stretch_the_collective_timeout_to_four_slowest_steps() -> None:
    # A healthy collective may wait a whole slow step for its slowest peer.
    assert GlooTimeouts(60, 10).safe_collective_seconds(3.2) == 13
    # The join timeout bounds only the rendezvous: a collective may need longer.
    assert GlooTimeouts(60, 10).safe_collective_seconds(20.0) == 80


def test_use_gloo_timeouts_sets_what_horovods_next_init_reads() -> None:
    environ: dict[str, str] = {}
    use_gloo_timeouts(12, 60, environ)
    assert environ == {HOROVOD_TIMEOUT_ENV: "12", JOIN_TIMEOUT_ENV: "60"}
