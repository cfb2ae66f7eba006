"""Real Horovod, third build edit: rings form under the join timeout, collectives use the short one.

The edit is in scripts/build-horovod.sh; globaldl/elastic_timeouts.py says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from horovod_launch import horovod_python

from globaldl.elastic_timeouts import (
    HOROVOD_TIMEOUT_ENV,
    JOIN_TIMEOUT_ENV,
    horovod_splits_the_timeouts,
)

pytestmark = pytest.mark.horovod

COLLECTIVE_SECONDS = 3
JOIN_SECONDS = 40
LATE_SECONDS = 8  # rank 1's late start: longer than the collective timeout, within the join one


def test_the_set_ups_horovod_carries_the_join_timeout_edit() -> None:
    assert horovod_splits_the_timeouts(), "run `make setup`: Horovod predates the third edit"


def test_a_late_peer_joins_under_the_join_timeout_and_a_silent_one_fails_the_collective_timeout(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    probe = Path(__file__).with_name("gloo_timeout_probe.py")
    env = {
        **worker_env,
        HOROVOD_TIMEOUT_ENV: str(COLLECTIVE_SECONDS),
        JOIN_TIMEOUT_ENV: str(JOIN_SECONDS),
    }
    completed = horovod_python(
        probe, [str(tmp_path), str(LATE_SECONDS)], env, ranks=2, hosts="localhost:2",
        timeout_seconds=300,
    )  # fmt: skip
    report_path = tmp_path / "rank-0.json"
    assert report_path.exists(), completed.stdout[-3000:] + completed.stderr[-3000:]
    report = json.loads(report_path.read_text())
    # Unedited, rank 0's rendezvous would give up after the 3 s collective timeout.
    assert report["init_seconds"] > COLLECTIVE_SECONDS, report
    assert report["sum"] == 1.0, report
    # The silent peer: noticed after the collective timeout, long before the join timeout.
    assert report["error"] is not None, report
    assert COLLECTIVE_SECONDS - 0.5 < report["failed_after_seconds"] < JOIN_SECONDS / 2, report
