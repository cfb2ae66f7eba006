"""How every command reports bad input: one line on stderr naming the value, and exit code 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from globaldl.checkpoint import CheckpointError
from globaldl.settings import SettingsError
from globaldl.summary import SummaryError

USER_ERRORS: tuple[type[Exception], ...] = (
    SettingsError,
    SummaryError,
    CheckpointError,
    ValueError,
    OSError,
)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the errors a user can fix into one clear line and a non-zero exit."""
    try:
        yield
    except USER_ERRORS as error:
        typer.echo(f"globaldl: error: {error}", err=True)
        raise typer.Exit(code=2) from None
