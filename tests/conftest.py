"""Shared test fixtures: paths to the installed tools, and a guard for Horovod launches."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import globaldl  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any test imports TensorFlow)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    for tool in ("horovodrun", "globaldl"):
        if not (BIN / tool).exists():
            pytest.fail(f"{BIN / tool} is missing: run `make setup` first")
    return BIN


@pytest.fixture(scope="session")
def worker_env() -> dict[str, str]:
    """Environment for launched workers: quiet TensorFlow, no inherited settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLOBALDL_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env
