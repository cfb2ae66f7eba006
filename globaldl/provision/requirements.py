"""The controller's Python stack, pinned: what every device installs, version for version."""

from __future__ import annotations

import importlib.metadata as metadata
import re

from packaging.requirements import Requirement

# Installed on devices from their own wheels, not from the pinned list: globaldl is built from
# the controller's source, Horovod once per architecture with globaldl's patches.
BUILT_HERE = ("globaldl", "horovod")


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name (`tf_keras` -> `tf-keras`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(roots: tuple[str, ...] = BUILT_HERE) -> dict[str, str]:
    """Every distribution the roots need at run time (no extras), with its installed version.

    Raises ValueError naming a requirement that is not installed on this machine: the pinned
    list is read from what the controller runs, so the controller must have run the set-up.
    """
    versions: dict[str, str] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        key = canonical_name(name)
        if key in versions:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ValueError(
                f"{name} is not installed here; run scripts/setup.sh (make setup) on the "
                "controller first: the devices get exactly its versions"
            ) from None
        versions[key] = distribution.version
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return versions


def pinned_stack() -> str:
    """requirements.txt text: the closure of globaldl and Horovod, less the two built here."""
    closure = runtime_closure()
    lines = [
        f"{name}=={version}" for name, version in sorted(closure.items()) if name not in BUILT_HERE
    ]
    return "\n".join(lines) + "\n"
