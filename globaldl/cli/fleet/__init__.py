"""`globaldl fleet`: an emulated IoT fleet on this machine (namespaces, shaped links, sshd)."""

# Commands are listed in `--help` in the order their modules register them.
from globaldl.cli.fleet import up, lifecycle, status, measure, tcp, timeline, run  # noqa: I001
from globaldl.cli.fleet._common import app

__all__ = ["app", "lifecycle", "measure", "run", "status", "tcp", "timeline", "up"]
