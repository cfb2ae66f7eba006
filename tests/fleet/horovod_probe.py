"""A tiny Horovod program for fleet runs: allreduce a known tensor, say who ran where, summarise.

Usage: python horovod_probe.py SUMMARY_PATH TENSOR_BYTES STEPS [HOLD_SECONDS]
Each rank allreduces a float32 tensor of TENSOR_BYTES filled with rank + 1, STEPS times, and
prints one JSON line; rank 0 writes a summary with the run-summary fields the fleet's byte
accounting reads (gradient_bytes_wire = bytes one rank handed to the collective).
HOLD_SECONDS keeps every rank alive afterwards. With PROBE_TARGETS_DIR set, rank 0 also
reports the Prometheus file-SD targets registered there during the run.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf


def main() -> None:
    summary_path, tensor_bytes, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    hold_seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    hvd.init()
    values = tf.fill([tensor_bytes // 4], float(hvd.rank() + 1))
    hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="warmup")
    started = time.monotonic()
    for _ in range(steps):
        total = hvd.allreduce(values, op=hvd.Sum, name="gradient")
    exchange_seconds = time.monotonic() - started
    report = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "sum": float(total[0]),
        "exchange_seconds": exchange_seconds,
    }
    targets_dir = os.environ.get("PROBE_TARGETS_DIR")
    if targets_dir and hvd.rank() == 0:
        # What Prometheus file-SD sees while the run lasts.
        report["targets"] = [
            target
            for path in sorted(Path(targets_dir).glob("*.json"))
            for entry in json.loads(path.read_text())
            for target in entry["targets"]
        ]
    print(f"PROBE {json.dumps(report)}", flush=True)
    if hvd.rank() == 0:
        summary = {
            "gradient_bytes_wire": tensor_bytes * steps,
            "steps": steps,
            "ranks": hvd.size(),
            "exchange": {"combine": "sum", "collectives_per_step": 1, "hierarchy": "none"},
            "exchange_seconds": exchange_seconds,
        }
        temporary = summary_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(summary))
        os.replace(temporary, summary_path)
    time.sleep(hold_seconds)


if __name__ == "__main__":
    main()
