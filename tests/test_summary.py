from __future__ import annotations

import copy
from pathlib import Path

import pytest

from globaldl import summary
from globaldl.summary import SummaryError

GOOD = {
    "schema_version": 1,
    "run_id": "run-1",
    "model": "lenet",
    "dataset": "mnist",
    "ranks": 2,
    "epochs": 2,
    "steps": 124,
    "global_batch_size": 64,
    "val_accuracy": 0.93,
    "val_loss": 0.25,
    "wall_seconds": 31.5,
    "phase_seconds": {
        "data_load": 0.1,
        "compute": 5.0,
        "compress": 0.0,
        "exchange": 2.0,
        "decompress": 0.0,
        "apply": 0.3,
    },
    "gradient_bytes_raw": 1000,
    "gradient_bytes_wire": 1000,
    "compression_ratio": 1.0,
    "compression": {"prune": "none", "density": 0.01, "quantize": "none", "error_feedback": True},
    "versions": {
        "tensorflow": "2.21.0",
        "horovod": "0.28.1",
        "globaldl": "0.1.0",
        "python": "3.11.7",
    },
}


def test_a_complete_summary_validates_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    summary.write(path, GOOD)
    assert summary.read(path) == GOOD


@pytest.mark.parametrize("field", ["ranks", "phase_seconds", "gradient_bytes_wire", "versions"])
def test_a_missing_field_is_named(field: str) -> None:
    broken = copy.deepcopy(GOOD)
    del broken[field]
    with pytest.raises(SummaryError, match=f"'{field}' is a required property"):
        summary.validate(broken)


def test_a_wrong_value_names_its_path() -> None:
    broken = copy.deepcopy(GOOD)
    broken["phase_seconds"]["compute"] = -1.0
    with pytest.raises(SummaryError, match="phase_seconds/compute"):
        summary.validate(broken)


def test_per_rank_totals_validate_and_a_negative_cpu_time_is_named() -> None:
    with_ranks = copy.deepcopy(GOOD)
    with_ranks["rank_totals"] = [
        {"phase_seconds": dict(GOOD["phase_seconds"]), "cpu_seconds": 12.5} for _ in range(2)
    ]
    summary.validate(with_ranks)
    with_ranks["rank_totals"][1]["cpu_seconds"] = -1.0
    with pytest.raises(SummaryError, match="rank_totals/1/cpu_seconds"):
        summary.validate(with_ranks)


def test_an_invalid_summary_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    broken = dict(GOOD, val_accuracy=1.5)
    with pytest.raises(SummaryError):
        summary.write(path, broken)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_summary_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    summary.write(path, GOOD)
    summary.write(path, dict(GOOD, run_id="run-2"))
    assert summary.read(path)["run_id"] == "run-2"
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_compression_ratio_is_raw_over_wire_and_none_without_traffic() -> None:
    assert summary.compression_ratio(5000, 50) == 100.0
    assert summary.compression_ratio(5000, 0) is None


def test_unwritable_summary_paths_are_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(SummaryError, match="does not exist"):
        summary.check_writable(tmp_path / "missing" / "s.json")
    with pytest.raises(SummaryError, match="is a directory"):
        summary.check_writable(tmp_path)
    # /proc takes no new files, not even from root: a directory that exists but refuses writes.
    with pytest.raises(SummaryError, match="not writable"):
        summary.check_writable(Path("/proc/s.json"))
