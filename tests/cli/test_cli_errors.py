"""The one CLI error handler: bad input exits 2, a refusal by the system 1, bugs keep tracebacks."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from globaldl.checkpoint import CheckpointError
from globaldl.cli.errors import user_errors
from globaldl.fleet.fleet import FleetError
from globaldl.settings import SettingsError


def _app_raising(error: Exception, refused: tuple[type[Exception], ...] = ()) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def fail() -> None:
        with user_errors(refused=refused):
            raise error

    return app


@pytest.mark.parametrize(
    "error",
    [
        ValueError("--density 2 is not allowed; use (0, 1]"),
        SettingsError("--density 2 is not allowed; use (0, 1]"),
        FileNotFoundError("--density 2 is not allowed; use (0, 1]"),
        CheckpointError("--density 2 is not allowed; use (0, 1]"),
    ],
)
def test_bad_input_is_one_line_naming_the_value_and_exit_code_2(error: Exception) -> None:
    result = CliRunner().invoke(_app_raising(error), [])
    assert result.exit_code == 2
    assert result.output == "globaldl: error: --density 2 is not allowed; use (0, 1]\n"


def test_a_fleet_the_system_refused_exits_1_with_one_line() -> None:
    result = CliRunner().invoke(_app_raising(FleetError("fleet up failed: no bridge")), [])
    assert (result.exit_code, result.output) == (1, "globaldl: error: fleet up failed: no bridge\n")


def test_a_command_may_name_more_refusals_and_other_errors_keep_their_traceback() -> None:
    sshd_failed = RuntimeError("sshd for gdl-2 did not daemonise within 15 s")
    refused = CliRunner().invoke(_app_raising(sshd_failed, refused=(RuntimeError,)), [])
    assert refused.exit_code == 1 and "did not daemonise" in refused.output
    bug = CliRunner().invoke(_app_raising(RuntimeError("a bug")), [])
    assert bug.exit_code == 1 and isinstance(bug.exception, RuntimeError)
    assert "globaldl: error" not in bug.output
