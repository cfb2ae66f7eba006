"""The `globaldl` command: one sub-command per module in this package."""

from __future__ import annotations

import typer

from globaldl.cli import (
    bench,
    dashboards,
    doctor,
    experiment,
    fleet,
    monitor,
    provision,
    report,
    train,
)

app = typer.Typer(
    name="globaldl",
    help="Train one TensorFlow model across many small devices with Horovod, and show where the "
    "time goes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(name="train", cls=train.PlainHelpCommand)(train.train)
app.command(name="doctor")(doctor.doctor)
app.add_typer(bench.app, name="bench")
app.add_typer(fleet.app, name="fleet")
app.add_typer(monitor.app, name="monitor")
app.add_typer(dashboards.app, name="dashboards")
app.add_typer(report.app, name="report")
app.add_typer(experiment.app, name="experiment")
app.add_typer(provision.app, name="provision")


@app.callback()
def _root() -> None:
    """Train one model across many small devices, compress its gradients, see where time goes."""


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
