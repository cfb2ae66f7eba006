"""How every command reports failures a user can act on: one line on stderr and an exit code.

Bad input (a value that is not allowed, a file that cannot be read or written) exits with 2; an
operation the system refused (a fleet that could not be built or removed) exits with 1. Both
print `globaldl: error: ...` with the message, never a traceback. The module imports nothing
heavy: `globaldl fleet hosts`, which Horovod Elastic runs every few seconds, uses it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from globaldl.checkpoint import CheckpointError

# SettingsError and SummaryError are ValueErrors; CheckpointError is a RuntimeError.
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError, CheckpointError)
USER_ERROR_EXIT_CODE = 2
REFUSED_EXIT_CODE = 1


@contextmanager
def user_errors(refused: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Turn the errors a user can act on into one clear line and a non-zero exit.

    FleetError (and the `refused` types a command adds, e.g. RuntimeError for a device whose
    sshd would not start) exit with 1; USER_ERRORS with 2; anything else propagates.
    """
    try:
        yield
    except USER_ERRORS as error:
        _exit(error, USER_ERROR_EXIT_CODE)
    except Exception as error:
        from globaldl.fleet.fleet import FleetError  # only on this path: it loads the fleet

        if not isinstance(error, (FleetError, *refused)):
            raise
        _exit(error, REFUSED_EXIT_CODE)


def _exit(error: Exception, code: int) -> None:
    typer.echo(f"globaldl: error: {error}", err=True)
    raise typer.Exit(code=code) from None
