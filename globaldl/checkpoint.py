"""Checkpoints written atomically and verified on read, with fallback to the last good one.

Layout under the checkpoint directory:

    epoch-0003/            shared state (model, optimizer, counters), written by rank 0
        state.index, state.data-00000-of-00001, manifest.json (sha256 of every file)
    rank-00001/epoch-0003/ one rank's own state (compression residuals, DGC momentum)

Each checkpoint is written into a hidden temporary directory and renamed into place, so a
reader never sees half a checkpoint; the manifest is what makes a truncated or altered file
detectable. The newest `KEEP` checkpoints are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # TensorFlow loads only when a checkpoint is really written or read
    import tensorflow as tf

KEEP = 3
MANIFEST = "manifest.json"
PREFIX = "state"
_EPOCH_DIR = re.compile(r"^epoch-(\d{4,})$")

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message names the file."""


def epoch_dir_name(epoch: int) -> str:
    """Directory name of the checkpoint taken after `epoch` epochs."""
    return f"epoch-{epoch:04d}"


def rank_dir(checkpoint_dir: Path, rank: int) -> Path:
    """Where one rank keeps its own state."""
    return Path(checkpoint_dir) / f"rank-{rank:05d}"


def check_writable(checkpoint_dir: Path) -> None:
    """Fail before training starts if the checkpoint directory cannot be written."""
    try:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=checkpoint_dir, prefix=".probe-"):
            pass
    except OSError as error:
        raise CheckpointError(
            f"checkpoint directory {checkpoint_dir} is not writable: {error.strerror}"
        ) from error


def save(directory: Path, epoch: int, checkpoint: tf.train.Checkpoint, metadata: dict) -> Path:
    """Write `checkpoint` as the state after `epoch` epochs, atomically; prune old ones."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / epoch_dir_name(epoch)
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=f".{final.name}-"))
    try:
        checkpoint.write(str(staging / PREFIX))
        files = {path.name: _sha256(path) for path in sorted(staging.iterdir()) if path.is_file()}
        manifest = {"epoch": epoch, "files": files, **metadata}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _prune(directory)
    return final


def available_epochs(directory: Path) -> list[int]:
    """Epochs that have a checkpoint directory, newest first (not yet verified)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    epochs = [
        int(match.group(1))
        for entry in directory.iterdir()
        if entry.is_dir() and (match := _EPOCH_DIR.match(entry.name))
    ]
    return sorted(epochs, reverse=True)


def verify(checkpoint_path: Path) -> dict:
    """Check a checkpoint's files against its manifest; return the manifest."""
    manifest_path = checkpoint_path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"checkpoint manifest {manifest_path} is unreadable: {error}"
        ) from error
    for name, expected in manifest.get("files", {}).items():
        path = checkpoint_path / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        if _sha256(path) != expected:
            raise CheckpointError(f"checkpoint file {path} is corrupted (checksum mismatch)")
    return manifest


def latest_good(directory: Path) -> tuple[int, dict] | None:
    """The newest checkpoint whose files verify; a bad one is reported and skipped."""
    for epoch in available_epochs(directory):
        path = Path(directory) / epoch_dir_name(epoch)
        try:
            return epoch, verify(path)
        except CheckpointError as error:
            log.error("%s; falling back to the previous checkpoint", error)
    return None


def restore(directory: Path, epoch: int, checkpoint: tf.train.Checkpoint) -> dict:
    """Verify, then load the checkpoint of `epoch` into `checkpoint`'s objects."""
    import tensorflow as tf

    path = Path(directory) / epoch_dir_name(epoch)
    manifest = verify(path)
    try:
        checkpoint.read(str(path / PREFIX)).assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path / PREFIX} cannot be restored: {error}") from error
    return manifest


def _prune(directory: Path) -> None:
    for epoch in available_epochs(directory)[KEEP:]:
        shutil.rmtree(Path(directory) / epoch_dir_name(epoch), ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
