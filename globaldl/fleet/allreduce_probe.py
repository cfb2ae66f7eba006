"""Time one cached collective on every rank: a coordination cycle plus Gloo's ring.

Run on every device by horovodrun, e.g. on the emulated fleet:
`globaldl fleet run --exec -- .venv/bin/python -m globaldl.fleet.allreduce_probe`. Every rank
allreduces the same one-float tensor, first `--warm-up` times (the first negotiates it; the
others meet Horovod's response cache), then `--probes` times, timing each. Rank 0 prints one
line, `ALLREDUCE_PROBE {json}`, with its times. On delayed links the time is latency: Horovod's
coordination (a Gloo ring allreduce of a bit vector, which travels as a chain of single
messages) and the one-float ring itself, both growing with the number of ranks.

`--bytes 2502,62195` times a collective of each size instead (float32 for an allreduce, uint8
for `--collective allgather`, each rank's share), one result line per size: what a gathered
payload costs against a summed one of the same bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence

RESULT_PREFIX = "ALLREDUCE_PROBE "
TENSOR_NAME = "allreduce_probe"
COLLECTIVES = ("allreduce", "allgather")


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


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be byte counts like 4,2502; got {text!r}") from None
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"every size must be at least 1 byte, got {text!r}")
    return sizes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m globaldl.fleet.allreduce_probe")
    parser.add_argument("--probes", type=_positive, default=12, help="timed collectives")
    parser.add_argument("--warm-up", type=_positive, default=3, help="untimed collectives first")
    parser.add_argument("--collective", choices=COLLECTIVES, default="allreduce")
    parser.add_argument(
        "--bytes",
        type=_sizes,
        default=[4],
        help="each rank's bytes, comma-separated (allreduce: whole float32s)",
    )
    return parser


def _collective(hvd, tf, kind: str, size: int) -> Callable[[], object]:
    """One call of the probed collective: each rank's `size` bytes allgathered or summed."""
    if kind == "allgather":
        gathered = tf.ones([size], tf.uint8)
        return lambda: hvd.allgather(gathered, name=f"{TENSOR_NAME}_gather_{size}")
    summed = tf.ones([size // 4], tf.float32)
    # The one-float default keeps the name the committed probe runs used.
    name = TENSOR_NAME if size == 4 else f"{TENSOR_NAME}_{size}"
    return lambda: hvd.allreduce(summed, name=name)


def main(argv: Sequence[str] | None = None) -> int:
    """Time the collectives on this rank; rank 0 prints one result line per size."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.collective == "allreduce" and any(size % 4 for size in args.bytes):
        parser.error(f"--bytes of an allreduce must be whole float32s, got {args.bytes}")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    for size in args.bytes:
        collective = _collective(hvd, tf, args.collective, size)
        for _ in range(args.warm_up):
            collective()
        seconds = []
        for _ in range(args.probes):
            start = time.perf_counter()
            collective()
            seconds.append(time.perf_counter() - start)
        if hvd.rank() == 0:
            result = {
                "ranks": hvd.size(),
                "collective": args.collective,
                "bytes": size,
                "median_seconds": statistics.median(seconds),
                "min_seconds": min(seconds),
                "max_seconds": max(seconds),
                "seconds": seconds,
            }
            print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
