import json

import pytest

from globaldl.monitoring.discovery import (
    metrics_targets,
    parse_hosts,
    remove_targets,
    write_targets,
)


def test_one_target_per_rank_in_horovod_rank_order():
    targets = metrics_targets([("edge-a", 2), ("edge-b", 1), ("::1", 1)], base_port=9400)
    assert [(t.address, t.rank) for t in targets] == [
        ("edge-a:9400", 0),
        ("edge-a:9401", 1),
        ("edge-b:9400", 2),
        ("[::1]:9400", 3),
    ]


def test_write_targets_writes_file_sd_json_atomically(tmp_path):
    directory = tmp_path / "targets" / "globaldl"
    path = write_targets(directory, run_id="run-1", hosts=[("localhost", 2)], base_port=9400)
    assert path == directory / "run-1.json"
    assert json.loads(path.read_text()) == [
        {"targets": ["localhost:9400"], "labels": {"run": "run-1", "rank": "0"}},
        {"targets": ["localhost:9401"], "labels": {"run": "run-1", "rank": "1"}},
    ]
    assert path.stat().st_mode & 0o444 == 0o444  # readable by a Prometheus running as another user
    # Rewriting replaces the file whole and leaves no temporary behind.
    write_targets(directory, run_id="run-1", hosts=[("localhost", 1)], base_port=9500)
    assert len(json.loads(path.read_text())) == 1
    assert [p.name for p in directory.iterdir()] == ["run-1.json"]
    assert remove_targets(directory, "run-1") is True
    assert remove_targets(directory, "run-1") is False


def test_parse_hosts_reads_horovodrun_syntax():
    assert parse_hosts("localhost:2") == [("localhost", 2)]
    assert parse_hosts("a:2, b") == [("a", 2), ("b", 1)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda d: write_targets(d, run_id="a/b", hosts=[("h", 1)], base_port=9400),
            "run id 'a/b' is not allowed",
        ),
        (
            lambda d: write_targets(d, run_id="r", hosts=[("h", 0)], base_port=9400),
            "host 'h' has 0 slots",
        ),
        (lambda d: write_targets(d, run_id="r", hosts=[("", 1)], base_port=9400), "host '' in"),
        (
            lambda d: write_targets(d, run_id="r", hosts=[("h", 1)], base_port=0),
            "base_port 0 is out of range",
        ),
        (
            lambda d: write_targets(d, run_id="r", hosts=[("h", 3)], base_port=65534),
            "needs ports 65534-65536",
        ),
        (lambda d: parse_hosts("h:x"), "host entry 'h:x'"),
    ],
)
def test_bad_targets_raise_value_error_naming_them(tmp_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(tmp_path)
