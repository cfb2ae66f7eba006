"""`globaldl train` reads well: every choice in --help at 80 columns, native noise held back."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from globaldl.cli.quiet import quiet_native_start
from globaldl.compression.config import PRUNE_NAMES, QUANTIZE_NAMES
from globaldl.settings import (
    BALANCE_NAMES,
    DATASET_NAMES,
    HIERARCHY_NAMES,
    MODEL_NAMES,
    OPTIMIZER_NAMES,
)


def test_help_at_80_columns_shows_every_choice_and_cuts_nothing(venv_bin) -> None:
    completed = subprocess.run(
        [str(venv_bin / "globaldl"), "train", "--help"],
        env={**os.environ, "COLUMNS": "80", "TERM": "dumb"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = completed.stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    words = set(text.replace(",", " ").replace("(", " ").replace(")", " ").split())
    for names in (MODEL_NAMES, DATASET_NAMES, OPTIMIZER_NAMES, PRUNE_NAMES, QUANTIZE_NAMES,
                  BALANCE_NAMES, HIERARCHY_NAMES):  # fmt: skip
        missing = [name for name in names if name not in words]
        assert not missing, f"--help lacks {missing}"
    for option in ("--max-steps-per-epoch", "--metrics-basic-auth-file", "--verbose"):
        assert option in text


def _native_write(text: bytes) -> None:
    """Write to fd 2 from C, as TensorFlow's logging does (bypassing sys.stderr)."""
    ctypes.CDLL(None).write(2, text, len(text))


@pytest.mark.parametrize("verbose", [False, True])
def test_native_stderr_is_held_back_unless_verbose(capfd, verbose: bool) -> None:
    with quiet_native_start(verbose):
        _native_write(b"cudart_stub.cc:31] Could not find cuda drivers\n")
    _native_write(b"after\n")
    err = capfd.readouterr().err
    assert ("cuda drivers" in err) is verbose
    assert "after" in err


def test_what_was_held_back_is_shown_when_loading_fails(capfd) -> None:
    with pytest.raises(ImportError), quiet_native_start(False):
        _native_write(b"libfoo.so: cannot open shared object file\n")
        raise ImportError("no foo")
    assert "cannot open shared object file" in capfd.readouterr().err


def test_tensorflow_import_prints_nothing_by_default() -> None:
    code = (
        "from globaldl.cli.quiet import quiet_native_start\n"
        "with quiet_native_start(False):\n    import tensorflow\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    completed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
