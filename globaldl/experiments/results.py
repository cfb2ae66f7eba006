"""What a run left: `RunResult`, where results live on disk, and paths that travel with them.

Layout of an experiment's folder (the `runs/` part stays local, the rest is committed):

    NAME.csv, NAME.md, NAME.json, NAME-runs.csv, *.png    tables, plots, every run's record
    runs/LABEL/repeat-K/result.json                       one run: RunResult.to_dict()
    runs/LABEL/repeat-K/summary.json, fleet-run.log, ...  its summary, byte accounting, log

Results written before repeats existed sit in `runs/LABEL/result.json` and count as repeat 1.
Paths inside results are written relative to the repository (`portable`), so results read the
same on every clone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globaldl.experiments.load import MachineLoad
from globaldl.experiments.scrape import DeviceResources
from globaldl.experiments.spec import RunSpec
from globaldl.fleet.profiles import LinkProfile

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
RESULT_FILE = "result.json"
# An absolute path into the `results/` folder of any clone of the repository.
_CLONE_RESULTS_PATH = re.compile(r"(?<![\w.-])/(?:[^\s/\"'=]+/)*?(?=results/)")


def portable(text: str, root: Path = REPOSITORY_ROOT) -> str:
    """`text` with paths inside the repository made relative to it.

    Also strips the clone's own location from paths into a `results/` folder written on
    another machine or clone (e.g. `/work/main/results/experiments/x` -> `results/...`).
    """
    text = text.replace(f"{Path(root).resolve()}/", "")
    return _CLONE_RESULTS_PATH.sub("", text)


def repeat_dir(out_dir: Path, label: str, repeat: int) -> Path:
    """The folder of one repeat of one run."""
    return Path(out_dir) / "runs" / label / f"repeat-{repeat}"


@dataclass
class RunResult:
    """What one run produced: its status, the summary and byte accounting, scraped resources.

    `repeat` numbers the run among the repeats of its label (1-based); `load` is the
    machine's load while it ran; `reruns` counts the times it was run again because the
    machine was busy.
    """

    spec: RunSpec
    status: str
    run_id: str
    run_dir: Path
    cycle_time_ms: float
    link: LinkProfile
    train_command: str
    fleet_command: str
    latency_emulated: bool | None = None
    run_seconds: float | None = None
    summary: dict[str, Any] | None = None
    accounting: dict[str, Any] | None = None
    resources: dict[str, DeviceResources] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    repeat: int = 1
    load: MachineLoad | None = None
    reruns: int = 0
    # The machine the run was taken on (globaldl.bench.results.machine_description); None
    # for runs recorded before runs carried it and not in a NAME.json that names it.
    machine: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """The run finished and left a summary."""
        return self.status == "ok" and self.summary is not None

    @property
    def machine_busy(self) -> bool | None:
        """Whether the machine was busy during the run (None: not recorded or not known)."""
        return None if self.load is None else self.load.busy

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Inverse of `to_dict` (to rebuild tables from a results folder)."""
        return cls(
            spec=RunSpec.from_config(data["spec"]),
            status=data["status"],
            run_id=data["run_id"],
            run_dir=Path(data["run_dir"]),
            cycle_time_ms=data["cycle_time_ms"],
            link=LinkProfile.from_config(data["link"]),
            train_command=data["train_command"],
            fleet_command=data["fleet_command"],
            latency_emulated=data["latency_emulated"],
            run_seconds=data["run_seconds"],
            summary=data["summary"],
            accounting=data["accounting"],
            resources={
                name: DeviceResources(**values) for name, values in data["resources"].items()
            },
            faults=data.get("faults", []),
            repeat=data.get("repeat", 1),
            load=MachineLoad.from_dict(data["load"]) if data.get("load") else None,
            reruns=data.get("reruns", 0),
            machine=data.get("machine"),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the summary's history included); `from_dict` reads it back."""
        return {
            "spec": self.spec.get_config(),
            "status": self.status,
            "run_id": self.run_id,
            "run_dir": portable(str(self.run_dir)),
            "cycle_time_ms": self.cycle_time_ms,
            "link": self.link.get_config(),
            "train_command": portable(self.train_command),
            "fleet_command": portable(self.fleet_command),
            "latency_emulated": self.latency_emulated,
            "run_seconds": self.run_seconds,
            "summary": self.summary,
            "accounting": self.accounting,
            "resources": {name: r.to_dict() for name, r in self.resources.items()},
            "faults": self.faults,
            "repeat": self.repeat,
            "load": None if self.load is None else self.load.to_dict(),
            "reruns": self.reruns,
            "machine": self.machine,
        }


def load_results(
    out_dir: Path,
    specs: Sequence[RunSpec] | None = None,
    *,
    name: str | None = None,
    unplanned: bool = False,
) -> list[RunResult]:
    """The results recorded in `out_dir`, by repeat, then in the order of `specs`.

    Only runs with the labels of `specs`, unless `unplanned` (or no specs): then every
    recorded run, labels outside the plan after the others in recorded order. Read from
    `runs/` (see the module's layout) and from the `runs` list of `NAME.json` (`name`, or the
    experiment of the first spec), which is all a fresh clone has (runs stay local); a run in
    both (same label and repeat) is taken from `runs/`. So a run added with `--only` in a
    fresh clone keeps the committed runs beside it.
    """
    out_dir = Path(out_dir)
    name = name or (specs[0].experiment if specs else None)
    found = []
    if (out_dir / "runs").is_dir():
        found = [
            RunResult.from_dict(json.loads(path.read_text()))
            for path in sorted((out_dir / "runs").glob(f"*/{RESULT_FILE}"))
            + sorted((out_dir / "runs").glob(f"*/repeat-*/{RESULT_FILE}"))
        ]
    if name is not None and (out_dir / f"{name}.json").exists():
        local = {(result.spec.label, result.repeat) for result in found}
        document = json.loads((out_dir / f"{name}.json").read_text())
        committed = [RunResult.from_dict(run) for run in document.get("runs", [])]
        # Runs recorded before runs carried their machine were taken where the document says.
        for run in committed:
            if run.machine is None and _one_machine(document.get("machine")):
                run.machine = dict(document["machine"])
        found += [r for r in committed if (r.spec.label, r.repeat) not in local]
    order = {spec.label: index for index, spec in enumerate(specs or ())}
    if specs is not None and not unplanned:
        found = [result for result in found if result.spec.label in order]
    recorded = {id(result): index for index, result in enumerate(found)}
    return sorted(
        found,
        key=lambda r: (r.repeat, order.get(r.spec.label, len(order)), recorded[id(r)]),
    )


def recorded_ok(results: Sequence[RunResult], labels: Collection[str]) -> set[tuple[str, int]]:
    """The runs (label, repeat) of `labels` that `results` hold as finished: what --resume keeps."""
    return {(r.spec.label, r.repeat) for r in results if r.ok and r.spec.label in labels}


def _one_machine(machine: Any) -> bool:
    """Whether a document's `machine` describes one machine (not a list of several)."""
    return isinstance(machine, dict) and "cpu" in machine
