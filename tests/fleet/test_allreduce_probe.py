"""The collective probe: real horovodrun, two ranks on loopback; bad counts refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from globaldl.fleet import allreduce_probe

BIN = Path(sys.executable).parent


def _probe_on_two_ranks(worker_env: dict[str, str], *arguments: str) -> list[dict]:
    """Rank 0's result lines of the probe run by horovodrun on two local ranks."""
    completed = subprocess.run(
        [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"]
        + [str(BIN / "python"), "-m", "globaldl.fleet.allreduce_probe", *arguments],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return allreduce_probe.results_in(completed.stdout)


@pytest.mark.horovod
def test_two_ranks_time_every_probe_and_rank_0_reports_them(worker_env: dict[str, str]) -> None:
    [result] = _probe_on_two_ranks(worker_env, "--probes", "4")  # rank 0 alone reports
    assert result["ranks"] == 2
    assert (result["collective"], result["bytes"]) == ("allreduce", 4)
    assert len(result["seconds"]) == 4 and all(seconds > 0 for seconds in result["seconds"])
    assert result["min_seconds"] <= result["median_seconds"] <= result["max_seconds"]


@pytest.mark.horovod
def test_allgathers_of_several_sizes_report_one_line_each(worker_env: dict[str, str]) -> None:
    results = _probe_on_two_ranks(
        worker_env, "--probes", "2", "--collective", "allgather", "--bytes", "3,5000"
    )
    assert [(result["collective"], result["bytes"]) for result in results] == [
        ("allgather", 3),
        ("allgather", 5000),
    ]
    assert all(len(result["seconds"]) == 2 for result in results)


@pytest.mark.parametrize("flag", ["--probes", "--warm-up"])
def test_a_count_below_one_is_refused_naming_it(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        allreduce_probe.main([flag, "0"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert flag in error and "must be at least 1, got 0" in error


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--bytes", "0"], "every size must be at least 1 byte, got '0'"),
        (["--bytes", "4,x"], "must be byte counts like 4,2502; got '4,x'"),
        (["--bytes", "6"], "--bytes of an allreduce must be whole float32s, got [6]"),
        (["--collective", "broadcast"], "invalid choice: 'broadcast'"),
    ],
)
def test_sizes_and_collectives_it_cannot_probe_are_refused_naming_them(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        allreduce_probe.main(arguments)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
