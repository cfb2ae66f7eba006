"""The one atomic writer: whole files or none, the permissions asked for, nothing left behind."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from globaldl.files import (
    atomic_path,
    write_bytes_atomically,
    write_json_atomically,
    write_text_atomically,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_written_files_are_readable_by_others_unless_a_secret_mode_is_asked(tmp_path: Path) -> None:
    write_text_atomically(tmp_path / "report.md", "# report\n")
    write_json_atomically(tmp_path / "state.json", {"b": 1, "a": [2]}, mode=0o600)
    assert _mode(tmp_path / "report.md") == 0o644
    assert _mode(tmp_path / "state.json") == 0o600
    assert (tmp_path / "state.json").read_text() == json.dumps(
        {"a": [2], "b": 1}, indent=2, sort_keys=True
    ) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "state.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "shard.bin"
    write_bytes_atomically(target, b"old")
    with pytest.raises(RuntimeError, match="writer died"):
        with atomic_path(target) as temporary:
            temporary.write_bytes(b"half of the new conte")
            raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["shard.bin"]


def test_atomic_path_replaces_the_target_with_what_a_writer_left_under_the_temporary_name(
    tmp_path: Path,
) -> None:
    target = tmp_path / "data.tfrecord"
    with atomic_path(target) as temporary:
        assert temporary.parent == tmp_path and temporary.name.startswith(".data.tfrecord-")
        assert not target.exists()
        temporary.write_bytes(b"records")
    assert target.read_bytes() == b"records" and _mode(target) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["data.tfrecord"]


def test_compact_json_is_one_line_with_sorted_keys_and_the_same_document(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    document = {"b": {"y": [1, 2]}, "a": 1.5}
    write_json_atomically(path, document, indent=None)
    assert path.read_text() == '{"a":1.5,"b":{"y":[1,2]}}\n'
    assert json.loads(path.read_text()) == document
