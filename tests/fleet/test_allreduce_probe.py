"""The allreduce probe: real horovodrun, two ranks on loopback; bad counts refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from globaldl.fleet import allreduce_probe

BIN = Path(sys.executable).parent


@pytest.mark.horovod
def test_two_ranks_time_every_probe_and_rank_0_reports_them(worker_env: dict[str, str]) -> None:
    completed = subprocess.run(
        [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"]
        + [str(BIN / "python"), "-m", "globaldl.fleet.allreduce_probe", "--probes", "4"],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    [result] = allreduce_probe.results_in(completed.stdout)  # rank 0 alone reports
    assert result["ranks"] == 2
    assert len(result["seconds"]) == 4 and all(seconds > 0 for seconds in result["seconds"])
    assert result["min_seconds"] <= result["median_seconds"] <= result["max_seconds"]


@pytest.mark.parametrize("flag", ["--probes", "--warm-up"])
def test_a_count_below_one_is_refused_naming_it(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        allreduce_probe.main([flag, "0"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert flag in error and "must be at least 1, got 0" in error
