"""`python -m globaldl.cli.fleet`: the fleet commands without the `globaldl` entry point."""

import sys

from globaldl.cli.fleet import app

sys.exit(app())
