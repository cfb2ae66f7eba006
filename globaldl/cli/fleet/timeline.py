"""`globaldl fleet timeline`: the exchanges of a run and the coordination cycles between them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.fleet._common import app
from globaldl.files import write_json_atomically
from globaldl.fleet.timeline import read_events, summarize, waits
from globaldl.markdown import markdown_table

COLUMNS = ("start_seconds", "kinds", "wait_seconds", "exchange_seconds", "cycles")


@app.command()
def timeline(
    path: Annotated[Path, typer.Argument(help="Rank 0's Horovod timeline (HOROVOD_TIMELINE).")],
    kinds: Annotated[
        str | None,
        typer.Option(help="Summarise only exchanges of these collectives (e.g. ALLGATHER)."),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write every wait as JSON here.")] = None,
) -> None:
    """Each exchange of a run and the cycles Horovod's loop ran before it, from its timeline.

    Record the timeline with `HOROVOD_TIMELINE=PATH HOROVOD_TIMELINE_MARK_CYCLES=1 globaldl
    fleet run ...`. Collectives run back to back without a cycle between them are one exchange.
    Per exchange: the wait since the one before (the training thread's work and the loop's
    cycles), the exchange's own seconds, and the cycles begun meanwhile; then their medians and
    ranges, and how many waits took how many cycles.
    """
    with user_errors():
        if not path.is_file():
            raise ValueError(f"no timeline at {path}")
        found = waits(read_events(path))
        summary = summarize(found, kinds)
    rows = [wait.as_row() for wait in found]
    if out is not None:
        write_json_atomically(out, {"timeline": str(path), "summary": summary, "waits": rows})
    typer.echo(markdown_table(rows, COLUMNS), nl=False)
    wait, cycles = summary["wait_seconds"], summary["cycle_seconds"]
    typer.echo(
        f"{summary['exchanges']} exchanges ({summary['kinds']}): wait median "
        f"{wait['median']:.3f} s ({wait['min']:.3f}-{wait['max']:.3f}), exchange median "
        f"{summary['exchange_seconds']['median']:.3f} s; cycles per wait "
        + ", ".join(f"{count}: {times}x" for count, times in summary["cycles_per_wait"].items())
        + (
            f"; cycle median {cycles['median']:.3f} s ({cycles['min']:.3f}-{cycles['max']:.3f})"
            if cycles
            else ""
        )
    )
