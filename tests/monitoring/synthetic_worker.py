"""A stand-in for the trainer: one process that serves start_exporter and feeds it synthetic steps.

Used by the Prometheus and dashboard tests until the end-to-end test with a real `globaldl train`
under horovodrun. Each step reports `--dominant-phase` as the slowest phase, so the bottleneck
of this device is known in advance. The process exits by itself after --duration-seconds.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from globaldl.monitoring import PHASES, start_exporter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--dominant-phase", choices=PHASES, required=True)
    parser.add_argument("--step-interval-seconds", type=float, default=0.05)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--duration-seconds", type=float, default=120.0)
    arguments = parser.parse_args()

    exporter = start_exporter(
        port=arguments.port, rank=arguments.rank, device=arguments.device, run_id=arguments.run
    )
    print(f"serving {exporter.url}", flush=True)
    # Phase seconds: the dominant phase takes 40 ms, the others 1-8 ms.
    phase_seconds = {phase: 0.001 * (1 + index) for index, phase in enumerate(PHASES)}
    phase_seconds[arguments.dominant_phase] = 0.040
    deadline = time.monotonic() + arguments.duration_seconds
    step = 0
    try:
        while time.monotonic() < deadline:
            step += 1
            exporter.observe_step(
                phase_seconds,
                examples=32,
                gradient_bytes_raw=246_824,
                gradient_bytes_wire=24_684,
                loss=2.3 * math.exp(-step / 200),
                skipped=step % 50 == 0,
            )
            if step % arguments.steps_per_epoch == 0:
                epoch = step // arguments.steps_per_epoch
                exporter.observe_epoch(epoch, val_loss=2.0 / epoch, val_accuracy=1 - 0.5 / epoch)
            time.sleep(arguments.step_interval_seconds)
    finally:
        exporter.close()


if __name__ == "__main__":
    sys.exit(main())
