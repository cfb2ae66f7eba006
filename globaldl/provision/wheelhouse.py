"""The offline wheelhouse of one device platform, built once on the controller.

A Raspberry Pi has no compiler time to spare and often no route to a package index, so every
wheel a device installs is gathered here first, for the device's architecture and Python:

    WHEELHOUSE/x86_64-cp311/
        requirements.txt          the controller's stack, pinned (globaldl.provision.requirements)
        stack.tar                 requirements.txt and its wheels, plus uv: what devices unpack
        globaldl-*.whl            built from the controller's source, byte-reproducible
        horovod-0.28.1.tar.gz     Horovod's source, for the one device that builds the wheel
        horovod-0.28.1-*.whl      the patched wheel: from the controller's own set-up when it
                                  matches the platform, else built on a device and fetched back;
                                  a wheel without the newest edit of scripts/build-horovod.sh
                                  is removed, so the next playbook run builds a new one

`stack.tar` is written deterministically (sorted names, fixed times and owners), so the same
pins give the same bytes and Ansible's copy reports no change.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from globaldl import horovod_edits
from globaldl.provision.requirements import pinned_stack, runtime_closure

ARCHITECTURES: tuple[str, ...] = ("aarch64", "x86_64")
HOROVOD_VERSION = "0.28.1"
# Bookworm's glibc; every manylinux tag up to it is accepted (pip does not expand the tag).
NEWEST_GLIBC_MINOR = 36
# The installer devices use: one static binary, links wheels out of its cache.
UV_REQUIREMENT = "uv==0.13.9"
# Wheels written with this time have the same bytes for the same source (zip stores times).
REPRODUCIBLE_EPOCH = "315532800"
STACK_ARCHIVE = "stack.tar"
REQUIREMENTS_FILE = "requirements.txt"
STACK_STAMP = ".stack.sha256"


@dataclass(frozen=True)
class WheelhouseResult:
    """What `build_wheelhouse` did: where the platform's files are and what changed."""

    directory: str
    platform: str
    changed: list[str]
    horovod_wheel: str | None

    def to_json(self) -> str:
        """One JSON line (the playbook reads `changed` and `horovod_wheel`)."""
        return json.dumps({**asdict(self), "changed": bool(self.changed), "what": self.changed})


def platform_name(arch: str, python_version: str) -> str:
    """`x86_64-cp311` for x86_64 and Python 3.11; ValueError naming a bad value."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"architecture {arch!r} is not one of: {', '.join(ARCHITECTURES)}")
    major, _, minor = python_version.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"python version {python_version!r} must look like 3.11")
    return f"{arch}-cp{major}{minor}"


def platform_tags(arch: str) -> list[str]:
    """Every manylinux tag a Debian bookworm device of `arch` accepts, for `pip download`."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(17, NEWEST_GLIBC_MINOR + 1)]
    tags.append(f"manylinux2014_{arch}")
    if arch == "x86_64":
        tags += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    return tags


def build_wheelhouse(
    root: Path,
    arch: str,
    python_version: str,
    *,
    source_dir: Path | None = None,
    horovod_cache: Path | None = None,
) -> WheelhouseResult:
    """Make `root/PLATFORM` complete for `arch` and `python_version`; idempotent.

    `source_dir` is globaldl's source tree (default: the one this code runs from);
    `horovod_cache` is scripts/setup.sh's wheel cache, from which a patched Horovod wheel
    for this very platform and TensorFlow is reused instead of building one on a device.
    """
    name = platform_name(arch, python_version)
    controller_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python_version != controller_python:
        raise ValueError(
            f"devices run Python {python_version}, the controller {controller_python}: the pinned "
            "stack is read from the controller's environment, so run the playbook from a "
            f"controller with Python {python_version}"
        )
    directory = Path(root) / name
    directory.mkdir(parents=True, exist_ok=True)
    changed: list[str] = []
    if _gather_stack(directory, arch, python_version):
        changed.append(STACK_ARCHIVE)
    if _build_globaldl_wheel(directory, source_dir or _source_dir()):
        changed.append("globaldl wheel")
    if _download_horovod_source(directory):
        changed.append("horovod source")
    horovod_wheel = _horovod_wheel(directory)
    if horovod_wheel is None and horovod_cache is not None and arch == platform.machine():
        horovod_wheel = _reuse_setup_wheel(directory, horovod_cache, python_version)
        if horovod_wheel is not None:
            changed.append("horovod wheel")
    return WheelhouseResult(
        directory=str(directory),
        platform=name,
        changed=changed,
        horovod_wheel=None if horovod_wheel is None else str(horovod_wheel),
    )


def _source_dir() -> Path:
    import globaldl

    root = Path(globaldl.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise ValueError(
            f"globaldl runs from {root}, which is not a source tree (no pyproject.toml); "
            "pass --source DIR"
        )
    return root


def _pip(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"pip {' '.join(args[:2])} failed (exit {completed.returncode}):\n"
            + completed.stderr[-3000:]
        )


def _gather_stack(directory: Path, arch: str, python_version: str) -> bool:
    """Download the pinned stack's wheels for the platform and pack them; False if current."""
    requirements = pinned_stack() + f"{UV_REQUIREMENT}\n"
    digest = hashlib.sha256(requirements.encode()).hexdigest()
    stamp = directory / STACK_STAMP
    archive = directory / STACK_ARCHIVE
    if archive.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return False
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as temporary:
        download_dir = Path(temporary)
        (download_dir / REQUIREMENTS_FILE).write_text(requirements)
        platform_options = [option for tag in platform_tags(arch) for option in ("--platform", tag)]
        major, minor = python_version.split(".")
        _pip(
            "download", "--quiet", "--no-deps", "--only-binary=:all:",
            *platform_options,
            "--python-version", python_version, "--implementation", "cp",
            "--abi", f"cp{major}{minor}",
            "--requirement", str(download_dir / REQUIREMENTS_FILE),
            "--dest", str(download_dir),
        )  # fmt: skip
        _write_reproducible_tar(archive, sorted(download_dir.iterdir()))
    (directory / REQUIREMENTS_FILE).write_text(requirements)
    stamp.write_text(digest + "\n")
    return True


def _write_reproducible_tar(archive: Path, files: list[Path]) -> None:
    """A tar of `files` (flat) whose bytes depend only on their names and contents."""
    partial = archive.with_name(f".{archive.name}.partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            info = tarfile.TarInfo(path.name)
            info.size = path.stat().st_size
            info.mode = 0o644
            info.mtime = int(REPRODUCIBLE_EPOCH)
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    os.replace(partial, archive)


def _build_globaldl_wheel(directory: Path, source_dir: Path) -> bool:
    """Build globaldl's wheel from a clean copy of the source; keep the old file if equal."""
    with tempfile.TemporaryDirectory(prefix="globaldl-wheel-") as temporary:
        copy = Path(temporary) / "src"
        # A copy keeps build/ and *.egg-info out of the user's checkout.
        shutil.copytree(
            source_dir,
            copy,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "runs", "results",
                "tests", ".ruff_cache", ".pytest_cache",
            ),
        )  # fmt: skip
        out = Path(temporary) / "dist"
        env = {**os.environ, "SOURCE_DATE_EPOCH": REPRODUCIBLE_EPOCH}
        _pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", str(copy), "-w", str(out),
             env=env)  # fmt: skip
        (built,) = out.glob("globaldl-*.whl")
        target = directory / built.name
        if target.exists() and _sha256(target) == _sha256(built):
            return False
        for old in directory.glob("globaldl-*.whl"):
            old.unlink()
        shutil.copyfile(built, directory / f".{built.name}.partial")
        os.replace(directory / f".{built.name}.partial", target)
        return True


def _download_horovod_source(directory: Path) -> bool:
    sdist = directory / f"horovod-{HOROVOD_VERSION}.tar.gz"
    if sdist.exists():
        return False
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as temporary:
        # --no-deps with --no-binary: the archive only; its metadata is built on the device.
        _pip("download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"horovod=={HOROVOD_VERSION}", "--dest", temporary)  # fmt: skip
        os.replace(Path(temporary) / sdist.name, sdist)
    return True


def _has_newest_patch(wheel: Path) -> bool:
    try:
        with zipfile.ZipFile(wheel) as archive:
            patches = archive.read("horovod/globaldl_patches.py").decode()
    except (KeyError, zipfile.BadZipFile):
        return False
    return horovod_edits.NEWEST in patches


def _horovod_wheel(directory: Path) -> Path | None:
    """The wheelhouse's patched Horovod wheel; one built before the newest edit is removed."""
    for wheel in sorted(directory.glob(f"horovod-{HOROVOD_VERSION}-*.whl")):
        if _has_newest_patch(wheel):
            return wheel
        wheel.unlink()
    return None


def _reuse_setup_wheel(directory: Path, cache: Path, python_version: str) -> Path | None:
    """Copy scripts/setup.sh's patched wheel when it was built for this platform's TensorFlow."""
    tensorflow = runtime_closure().get("tensorflow")
    tag = "cp" + python_version.replace(".", "")
    candidates = sorted(
        (
            Path(cache)
            / f"horovod-{HOROVOD_VERSION}-{horovod_edits.WHEEL_TAG}-tf{tensorflow}-{tag}"
        ).glob(f"horovod-{HOROVOD_VERSION}-{tag}-{tag}-linux_{platform.machine()}.whl")
    )
    if not candidates:
        return None
    target = directory / candidates[0].name
    shutil.copyfile(candidates[0], directory / f".{target.name}.partial")
    os.replace(directory / f".{target.name}.partial", target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_horovod_cache() -> Path:
    """scripts/setup.sh's wheel cache (GLOBALDL_CACHE, default ~/.cache/globaldl)."""
    return Path(os.environ.get("GLOBALDL_CACHE", Path.home() / ".cache" / "globaldl"))
