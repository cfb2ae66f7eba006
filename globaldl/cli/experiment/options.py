"""The options every `globaldl experiment` command shares, defined once.

`experiment_command` adds them to a command's own options (the Typer signature is the
command's plus these) and hands the command one `SharedOptions` instead of twelve arguments.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer

DEFAULT_RESULTS_DIR = Path("results/experiments")
FULL_REPEATS, QUICK_REPEATS = 3, 1


@dataclass(frozen=True)
class SharedOptions:
    """What every experiment command takes: size, protocol, where to write, which fleet."""

    quick: bool = False
    repeats: int | None = None
    busy: str = "mark"
    max_reruns: int = 2
    cycle_time_ms: str = "auto"
    out: Path | None = None
    only: str | None = None
    resume: bool = False
    dry_run: bool = False
    state_dir: Path | None = None
    prefix: str | None = None
    subnet: str | None = None

    @property
    def repeat_count(self) -> int:
        """--repeats, or 3 for a full run and 1 for --quick."""
        if self.repeats is not None:
            return self.repeats
        return QUICK_REPEATS if self.quick else FULL_REPEATS

    @property
    def cycle_time(self) -> float | None:
        """--cycle-time-ms parsed: None for auto."""
        return parse_cycle_time(self.cycle_time_ms)

    @property
    def labels(self) -> list[str] | None:
        """--only as a list of run labels."""
        return parse_names(self.only)


OPTIONS: dict[str, Any] = {
    "quick": Annotated[
        bool, typer.Option("--quick", help="A short version: a few minutes on 2 cores.")
    ],
    "repeats": Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Repeats of every run, interleaved (repeat 1 of every run, then 2, ...); "
            f"tables show medians with min-max [default: {FULL_REPEATS}; quick: {QUICK_REPEATS}].",
        ),
    ],
    "busy": Annotated[
        str,
        typer.Option(
            help="A run taken while processes outside the fleet used the machine: mark it "
            "(kept, marked), refuse it (left out of the medians) or rerun it (after waiting "
            "for a quiet machine).",
        ),
    ],
    "max_reruns": Annotated[
        int, typer.Option(min=0, help="With --busy rerun: at most this many re-runs per run.")
    ],
    "cycle_time_ms": Annotated[
        str,
        typer.Option(
            "--cycle-time-ms",
            help="HOROVOD_CYCLE_TIME of the runs: auto (chosen per link so Horovod's idle "
            "coordination stays under 5% of it) or a number of milliseconds.",
        ),
    ],
    "out": Annotated[
        Path | None, typer.Option(help="Results folder [default: results/experiments/NAME].")
    ],
    "only": Annotated[
        str | None,
        typer.Option(
            help="Run only these runs (labels, comma-separated), every repeat; the tables and "
            "plots also take the other runs already in the results folder."
        ),
    ],
    "resume": Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Keep the runs (label and repeat) already recorded ok in the results folder "
            "and run only the rest, in the same interleaved order: a long experiment runs in "
            "parts, each interrupted (Ctrl-C) where its time ends.",
        ),
    ],
    "dry_run": Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print the plan (fleets, train commands) and its time; run nothing."
        ),
    ],
    "state_dir": Annotated[
        Path | None,
        typer.Option(
            help="State dir of the experiments' fleets [default: /run/globaldl-experiments]."
        ),
    ],
    "prefix": Annotated[
        str | None,
        typer.Option(help="Device name prefix of the experiments' fleets [default: gdlx]."),
    ],
    "subnet": Annotated[
        str | None, typer.Option(help="Subnet of the experiments' fleets [default: 10.78.0.0/24].")
    ],
}


def experiment_command(
    without: tuple[str, ...] = (),
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the shared options (except `without`) as its `shared` argument.

    Example:
        >>> @experiment_command()
        ... def tiny(shared: SharedOptions, width: int = 8) -> None:
        ...     ...   # `globaldl experiment tiny --width 4 --quick --repeats 5 ...`

    """
    names = [field.name for field in fields(SharedOptions) if field.name not in without]
    defaults = SharedOptions()

    def decorate(function: Callable[..., None]) -> Callable[..., None]:
        own = inspect.signature(function, eval_str=True)
        parameters = [p for p in own.parameters.values() if p.name != "shared"] + [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=getattr(defaults, name),
                annotation=OPTIONS[name],
            )
            for name in names
        ]

        @functools.wraps(function)
        def command(**arguments: Any) -> None:
            shared = SharedOptions(**{name: arguments.pop(name) for name in names})
            function(shared, **arguments)

        # What Typer reads: the command's own parameters followed by the shared ones.
        command.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return command

    return decorate


def parse_cycle_time(text: str) -> float | None:
    """`auto` -> None (chosen per link), else a positive number of milliseconds."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"--cycle-time-ms {text!r} is not allowed; use auto or milliseconds > 0"
        ) from None
    if not value > 0:
        raise ValueError(f"--cycle-time-ms {text!r} is not allowed; use auto or milliseconds > 0")
    return value


def parse_int_list(option: str, text: str) -> list[int]:
    """`1,2,4` -> [1, 2, 4]; ValueError naming the option otherwise."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r} must be whole numbers separated by commas") from None
    if not values or any(value < 1 for value in values):
        raise ValueError(f"{option} {text!r} must list whole numbers >= 1")
    return values


def parse_names(text: str | None) -> list[str] | None:
    """`a, b` -> ["a", "b"]; None or empty -> None."""
    if not text:
        return None
    return [part.strip() for part in text.split(",") if part.strip()] or None
