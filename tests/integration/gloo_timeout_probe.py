"""Under horovodrun -np 2: the rendezvous waits the join timeout, a collective the short one.

Usage: python gloo_timeout_probe.py OUT_DIR LATE_SECONDS
Rank 1 reaches `hvd.init` LATE_SECONDS after rank 0 (a joining device still starting). Both
sum their ranks once; then rank 1 stops itself (SIGSTOP: alive, silent, its connections open,
like a device whose radio went down) and rank 0 times how long its next allreduce takes to
fail. Rank 0 writes OUT_DIR/rank-0.json, then kills rank 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import tensorflow as tf


def main() -> None:
    out_dir, late_seconds = Path(sys.argv[1]), float(sys.argv[2])
    import horovod.tensorflow as hvd

    rank = int(os.environ["HOROVOD_RANK"])
    if rank == 1:
        time.sleep(late_seconds)
    started = time.monotonic()
    hvd.init()
    report: dict[str, object] = {"init_seconds": time.monotonic() - started}
    pids = hvd.allgather_object(os.getpid())
    report["sum"] = float(hvd.allreduce(tf.constant(float(rank)), op=hvd.Sum).numpy())
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    silent_from = time.monotonic()
    try:
        while time.monotonic() - silent_from < 120:
            hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
            time.sleep(0.05)
        report["error"] = None
    except Exception as error:  # noqa: BLE001  (the error Horovod raises is what we report)
        report["error"] = f"{type(error).__name__}: {error}"[:500]
    report["failed_after_seconds"] = time.monotonic() - silent_from
    (out_dir / "rank-0.json").write_text(json.dumps(report))
    os.kill(pids[1], signal.SIGKILL)


if __name__ == "__main__":
    main()
