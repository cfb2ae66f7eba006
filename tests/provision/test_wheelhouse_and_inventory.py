"""The controller side of provisioning: pins, platform tags, reproducible archives, inventory."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from globaldl import horovod_edits
from globaldl.provision.requirements import pinned_stack
from globaldl.provision.wheelhouse import (
    _horovod_wheel,
    _write_reproducible_tar,
    platform_name,
    platform_tags,
)

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "deploy" / "ansible"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def test_pinned_stack_is_the_controllers_versions_without_what_is_built_here() -> None:
    pins = dict(line.split("==") for line in pinned_stack().splitlines())
    assert pins["tensorflow"] == metadata.version("tensorflow")
    assert pins["tf-keras"] == metadata.version("tf_keras")
    assert "horovod" not in pins and "globaldl" not in pins
    assert "pytest" not in pins  # development tools stay on the controller


@pytest.mark.parametrize(
    ("arch", "python", "expected"),
    [("aarch64", "3.11", "aarch64-cp311"), ("x86_64", "3.12", "x86_64-cp312")],
)
def test_platform_name(arch: str, python: str, expected: str) -> None:
    assert platform_name(arch, python) == expected


@pytest.mark.parametrize(("arch", "python"), [("arm64", "3.11"), ("x86_64", "three")])
def test_platform_name_refuses_bad_values_by_name(arch: str, python: str) -> None:
    with pytest.raises(ValueError, match=arch if arch == "arm64" else python):
        platform_name(arch, python)


def test_platform_tags_cover_every_manylinux_glibc_a_bookworm_device_accepts() -> None:
    tags = platform_tags("aarch64")
    assert "manylinux2014_aarch64" in tags and "manylinux_2_17_aarch64" in tags
    assert "manylinux_2_36_aarch64" in tags and not any("x86_64" in tag for tag in tags)


def test_stack_archive_has_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for name in ("b.whl", "a.whl"):
        (tmp_path / "in" / name).write_bytes(name.encode() * 100)
    _write_reproducible_tar(tmp_path / "one.tar", sorted((tmp_path / "in").iterdir()))
    os.utime(tmp_path / "in" / "a.whl", (1, 1))  # times must not matter
    _write_reproducible_tar(tmp_path / "two.tar", sorted((tmp_path / "in").iterdir()))
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()


def _check_play(inventory: Path) -> subprocess.CompletedProcess[str]:
    """The first play of site.yml alone: it reads the inventory and contacts no device."""
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), "check-inventory.yml"],
        cwd=ANSIBLE,
        env={**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg")},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _wheel(path: Path, applied: tuple[str, ...]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("horovod/globaldl_patches.py", f"APPLIED = {applied!r}\n")
    return path


def test_a_wheelhouse_horovod_wheel_without_the_newest_edit_is_removed(tmp_path: Path) -> None:
    old = _wheel(tmp_path / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl", ("drop-xla-mpi-ops",))
    assert _horovod_wheel(tmp_path) is None
    assert not old.exists()
    new = _wheel(old, ("drop-xla-mpi-ops", horovod_edits.NEWEST))
    assert _horovod_wheel(tmp_path) == new and new.exists()


def test_example_inventory_passes_the_playbooks_check() -> None:
    completed = _check_play(ANSIBLE / "inventory.example")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "All assertions passed" in completed.stdout


def test_inventory_without_an_architecture_is_refused_naming_the_device(tmp_path: Path) -> None:
    inventory = yaml.safe_load((ANSIBLE / "inventory.example").read_text())
    del inventory["all"]["children"]["devices"]["hosts"]["pi-garage"]["arch"]
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    completed = _check_play(path)
    assert completed.returncode != 0
    assert "device pi-garage must set" in completed.stdout
