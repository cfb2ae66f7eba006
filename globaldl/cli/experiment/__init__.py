"""`globaldl experiment`: the papers' tables, measured on the emulated fleet under a protocol.

One module per command. The options every experiment shares (size, repeats, what to do on a
busy machine, where to write, which fleet) are defined once in `options.py`; `execute.py` holds
what every command does with its experiment (plan, run, write, report).
"""

from __future__ import annotations

import sys

import typer

from globaldl.cli.experiment import (
    ablation,
    all_experiments,
    balance,
    bottleneck,
    chaos,
    devices,
    latency,
    learning,
    recovery,
    report,
    resources,
    rounds,
    scale,
    scaling,
    sites,
)
from globaldl.cli.experiment.options import parse_cycle_time, parse_int_list

__all__ = ["app", "parse_cycle_time", "parse_int_list"]

app = typer.Typer(
    help="Experiments on the emulated fleet: each brings its own fleets up and down, runs "
    "`globaldl train` through `fleet run` (every run repeated, interleaved, the machine's load "
    "recorded), and writes CSV, JSON, markdown and PNG plots of the medians with their min-max.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(name="devices")(devices.devices)
app.command(name="resources")(resources.resources)
app.command(name="ablation")(ablation.ablation)
app.command(name="bottleneck")(bottleneck.bottleneck)
app.command(name="recovery")(recovery.recovery)
app.command(name="chaos")(chaos.chaos)
app.command(name="balance")(balance.balance)
app.command(name="rounds")(rounds.rounds)
app.command(name="latency")(latency.latency)
app.command(name="scale")(scale.scale)
app.command(name="sites")(sites.sites)
app.command(name="scaling")(scaling.scaling)
app.command(name="learning")(learning.learning)
app.command(name="all")(all_experiments.all_experiments)
app.command(name="report")(report.report)

if __name__ == "__main__":
    sys.exit(app())
