"""The build's fifth Horovod edit: horovodrun's ssh check waits as long as it is told.

Unedited, horovodrun checks ssh to every host with a fixed ConnectTimeout of 10 s, under one
NB-IoT round trip; `fleet run` sets GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS from the link. This
reads the installed Horovod's own launcher module and the ssh command it builds from it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from globaldl import horovod_edits

READ_TIMEOUT = (
    "import horovod.runner.launch as launch\n"
    "from horovod.runner.util.remote import get_remote_command\n"
    "print(launch.SSH_CONNECT_TIMEOUT_S)\n"
    "print(get_remote_command('true', host='10.0.0.2', timeout_s=launch.SSH_CONNECT_TIMEOUT_S))\n"
)


def _launcher_timeout(**env: str) -> tuple[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS"}
    lines = subprocess.run(
        [sys.executable, "-c", READ_TIMEOUT],
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    return lines[0], lines[1]


def test_the_ssh_check_waits_as_long_as_the_environment_says() -> None:
    assert horovod_edits.SSH_CONNECT_TIMEOUT in horovod_edits.installed()
    timeout, command = _launcher_timeout()
    assert timeout == "10" and "ConnectTimeout=10" in command  # Horovod's own default
    timeout, command = _launcher_timeout(GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS="28")
    assert timeout == "28" and "-o ConnectTimeout=28" in command
