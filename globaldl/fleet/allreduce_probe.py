"""Time one cached one-float allreduce on every rank: a coordination cycle plus a tiny ring.

Run on every device by horovodrun, e.g. on the emulated fleet:
`globaldl fleet run --exec -- .venv/bin/python -m globaldl.fleet.allreduce_probe`. Every rank
allreduces the same one-float tensor, first `--warm-up` times (the first negotiates it; the
others meet Horovod's response cache), then `--probes` times, timing each. Rank 0 prints one
line, `ALLREDUCE_PROBE {json}`, with its times. On delayed links the time is latency: Horovod's
coordination (a Gloo ring allreduce of a bit vector, which travels as a chain of single
messages) and the one-float ring itself, both growing with the number of ranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence

RESULT_PREFIX = "ALLREDUCE_PROBE "
TENSOR_NAME = "allreduce_probe"


def results_in(output: str) -> list[dict]:
    """Every result line's record in a run's output (horovodrun prefixes lines with the rank)."""
    return [
        json.loads(line.split(RESULT_PREFIX, 1)[1])
        for line in output.splitlines()
        if RESULT_PREFIX in line
    ]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m globaldl.fleet.allreduce_probe")
    parser.add_argument("--probes", type=_positive, default=12, help="timed allreduces")
    parser.add_argument("--warm-up", type=_positive, default=3, help="untimed allreduces first")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Time the allreduces on this rank; rank 0 prints the result line."""
    args = _parser().parse_args(argv)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    value = tf.constant([1.0])
    for _ in range(args.warm_up):
        hvd.allreduce(value, name=TENSOR_NAME)
    seconds = []
    for _ in range(args.probes):
        start = time.perf_counter()
        hvd.allreduce(value, name=TENSOR_NAME)
        seconds.append(time.perf_counter() - start)
    if hvd.rank() == 0:
        result = {
            "ranks": hvd.size(),
            "median_seconds": statistics.median(seconds),
            "min_seconds": min(seconds),
            "max_seconds": max(seconds),
            "seconds": seconds,
        }
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
