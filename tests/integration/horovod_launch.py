"""Launch real `horovodrun` runs of `globaldl train` from tests, with bounded waits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
LAUNCH_TIMEOUT_SECONDS = 600


def horovod_train(
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    ranks: int = 2,
    timeout_seconds: float = LAUNCH_TIMEOUT_SECONDS,
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run `horovodrun -np RANKS globaldl train ARGS --summary ...`; return the summary."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    summary_path = tmp_path / "summary.json"
    command = [
        str(BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
        str(BIN / "globaldl"), "train", *args, "--summary", str(summary_path),
    ]
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout_seconds, check=False
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"horovodrun exited {completed.returncode}\nstdout:\n{completed.stdout[-4000:]}"
            f"\nstderr:\n{completed.stderr[-4000:]}"
        )
    return json.loads(summary_path.read_text()), completed
