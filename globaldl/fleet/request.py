"""What `fleet run` starts on every device, read from the command line once and passed typed.

The run id, the summary path and the metrics port are what the launcher acts on (it accounts
the summary's bytes, registers Prometheus targets for the port). `TrainRequest` holds them as
typed fields, parsed once where the command line is read (`globaldl fleet run`, the experiment
runner); nothing further down inspects argument strings.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

BIN = Path(sys.executable).parent
DEFAULT_RUNS_DIR = Path("runs/fleet")
# Options of `globaldl train` that a TrainRequest holds as fields.
REQUEST_OPTIONS = ("--run-id", "--summary", "--metrics-port", "--metrics-addr")
# Where the metrics address is not given, each device binds its exporter to its own address:
# horovodrun runs one command line everywhere, and each device's /etc/hosts maps its host name
# to its own address.
OWN_ADDRESS_WRAPPER = ("/bin/sh", "-c", 'exec "$@" --metrics-addr "$(hostname -i)"', "sh")


def new_run_id() -> str:
    """A run id from the launch time, e.g. fleet-20250101-120000."""
    return datetime.now(timezone.utc).strftime("fleet-%Y%m%d-%H%M%S")


@dataclass(frozen=True)
class TrainRequest:
    """`globaldl train` on every device: the user's arguments, and what the launcher reads.

    Attributes:
        train_args: `globaldl train` arguments other than the fields below.
        run_id: the run's id (metrics label, run summary).
        summary_path: where rank 0 writes the run summary (absolute: workers may start
            elsewhere); the launcher accounts its bytes against the interfaces.
        metrics_port: base port of every worker's exporter, or None for no exporter.
        metrics_addr: address the exporters bind to; None binds each to its device's own.

    """

    train_args: tuple[str, ...]
    run_id: str
    summary_path: Path
    metrics_port: int | None = None
    metrics_addr: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "train_args", tuple(self.train_args))
        clashing = [arg for arg in self.train_args if arg.split("=", 1)[0] in REQUEST_OPTIONS]
        if clashing:
            raise ValueError(
                f"train arguments {clashing} belong in the request's fields (run_id, "
                "summary_path, metrics_port, metrics_addr), not in train_args"
            )
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise ValueError(f"metrics port must be in 1..65535, got {self.metrics_port}")

    @classmethod
    def from_command_line(
        cls,
        args: Sequence[str],
        *,
        run_id: str | None = None,
        summary: Path | None = None,
        metrics_port: int | None = None,
    ) -> TrainRequest:
        """Read the request's fields out of `globaldl train` arguments (`--x V` or `--x=V`).

        `run_id`, `summary` and `metrics_port` are `fleet run`'s own options; a value given
        both there and in `args` must agree. A relative summary path is resolved here, so
        every device writes the same file.
        """
        remaining, found = _take_options(list(args))
        chosen = {}
        for option, value in (
            ("--run-id", run_id),
            ("--summary", None if summary is None else str(summary)),
            ("--metrics-port", None if metrics_port is None else str(metrics_port)),
        ):
            given = found.get(option)
            if value is not None and given is not None and given != value:
                raise ValueError(
                    f"{option} is given twice with different values: {value!r} to fleet run and "
                    f"{given!r} after --; give it once"
                )
            chosen[option] = value if value is not None else given
        port_text = chosen["--metrics-port"]
        try:
            port = None if port_text is None else int(port_text)
        except ValueError:
            raise ValueError(f"--metrics-port {port_text!r} must be a whole number") from None
        request_id = chosen["--run-id"] or new_run_id()
        summary_path = Path(chosen["--summary"] or DEFAULT_RUNS_DIR / request_id / "summary.json")
        return cls(
            train_args=tuple(remaining),
            run_id=request_id,
            summary_path=summary_path.resolve(),
            metrics_port=port,
            metrics_addr=found.get("--metrics-addr"),
        )

    def argv(self, globaldl: Path | str = BIN / "globaldl") -> list[str]:
        """The worker command line every device runs."""
        args = [
            str(globaldl),
            "train",
            *self.train_args,
            "--run-id",
            self.run_id,
            "--summary",
            str(self.summary_path),
        ]
        if self.metrics_port is not None:
            args += ["--metrics-port", str(self.metrics_port)]
        if self.metrics_addr is not None:
            return [*args, "--metrics-addr", self.metrics_addr]
        return [*OWN_ADDRESS_WRAPPER, *args] if self.metrics_port is not None else args

    def command_line(self, summary_text: str | None = None) -> str:
        """`globaldl train ...` as a user would type it (the summary path as `summary_text`)."""
        args = [*self.argv("globaldl")]
        if args[0] != "globaldl":  # the own-address wrapper: show the command it wraps
            args = args[len(OWN_ADDRESS_WRAPPER) :]
        if summary_text is not None:
            args[args.index("--summary") + 1] = summary_text
        return shlex.join(args)


@dataclass(frozen=True)
class ProgramRequest:
    """Any program on every device (`fleet run --exec`): its command line, run id and files."""

    command: tuple[str, ...]
    run_id: str
    summary_path: Path | None = None
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        if not self.command:
            raise ValueError("--exec needs a command after --")

    def argv(self) -> list[str]:
        """The worker command line every device runs."""
        return list(self.command)


def _take_options(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split REQUEST_OPTIONS and their values out of `args`; the rest keeps its order."""
    remaining: list[str] = []
    found: dict[str, str] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        name, equals, value = arg.partition("=")
        if name in REQUEST_OPTIONS and equals:
            found[name] = value
        elif arg in REQUEST_OPTIONS:
            if index + 1 >= len(args):
                raise ValueError(f"{arg} needs a value")
            found[arg] = args[index + 1]
            index += 1
        else:
            remaining.append(arg)
        index += 1
    return remaining, found
