"""`fleet run`'s request: read from the command line once, then handed on as typed fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from globaldl.fleet.request import OWN_ADDRESS_WRAPPER, TrainRequest


def test_options_after_the_double_dash_become_typed_fields_and_leave_the_train_args() -> None:
    request = TrainRequest.from_command_line(
        ["--epochs", "1", "--metrics-port=9400", "--run-id", "r1", "--summary", "s.json"]
    )
    assert request.train_args == ("--epochs", "1")
    assert (request.run_id, request.metrics_port) == ("r1", 9400)
    # Resolved once here: every device writes the same file whatever its working directory.
    assert request.summary_path == Path("s.json").resolve()


def test_the_worker_command_binds_metrics_to_each_devices_own_address() -> None:
    request = TrainRequest(("--epochs", "1"), "r1", Path("/s.json"), metrics_port=9400)
    argv = request.argv(globaldl="/g")
    assert argv[: len(OWN_ADDRESS_WRAPPER)] == list(OWN_ADDRESS_WRAPPER)
    assert argv[len(OWN_ADDRESS_WRAPPER) :] == [
        "/g", "train", "--epochs", "1", "--run-id", "r1", "--summary", "/s.json",
        "--metrics-port", "9400",
    ]  # fmt: skip
    assert request.command_line("runs/s.json") == (
        "globaldl train --epochs 1 --run-id r1 --summary runs/s.json --metrics-port 9400"
    )
    bound = TrainRequest((), "r1", Path("/s.json"), metrics_port=9400, metrics_addr="0.0.0.0")
    assert bound.argv(globaldl="/g")[-2:] == ["--metrics-addr", "0.0.0.0"]
    assert TrainRequest((), "r1", Path("/s.json")).argv(globaldl="/g") == [
        "/g", "train", "--run-id", "r1", "--summary", "/s.json",
    ]  # fmt: skip


def test_a_value_given_twice_must_agree_and_a_bad_port_is_named() -> None:
    same = TrainRequest.from_command_line(["--run-id", "r1"], run_id="r1", metrics_port=9400)
    assert (same.run_id, same.metrics_port) == ("r1", 9400)
    with pytest.raises(ValueError, match="--metrics-port is given twice.*'9400'.*'9500'"):
        TrainRequest.from_command_line(["--metrics-port", "9500"], metrics_port=9400)
    with pytest.raises(ValueError, match="--metrics-port 'x' must be a whole number"):
        TrainRequest.from_command_line(["--metrics-port", "x"])
    with pytest.raises(ValueError, match="--summary needs a value"):
        TrainRequest.from_command_line(["--summary"])
    with pytest.raises(ValueError, match="belong in the request's fields"):
        TrainRequest(("--summary", "x.json"), "r1", Path("/s.json"))
