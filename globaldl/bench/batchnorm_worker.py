"""One rank of `globaldl bench batchnorm`: times each batch-norm variant's training step.

Launched by the benchmark (globaldl/bench/batchnorm.py) under `horovodrun` as
`python -m globaldl.bench.batchnorm_worker`; every rank runs the same models and variants in
the same order, and rank 0 writes what it measured as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESNET_DEPTHS_BY_NAME: dict[str, int] = {"resnet-8": 8, "resnet-20": 20}
# The collective op types of Horovod's TensorFlow kernels (HorovodSize and friends are not).
COLLECTIVE_OPS = frozenset(
    {
        "HorovodAllreduce",
        "HorovodGroupedAllreduce",
        "HorovodAllgather",
        "HorovodGroupedAllgather",
        "HorovodBroadcast",
        "HorovodAlltoall",
        "HorovodReducescatter",
        "HorovodGroupedReducescatter",
    }
)


def collectives_per_step(train_step: Any, iterator: Any) -> int:
    """Horovod collectives in one call of the traced training step (its graph and branches)."""
    graph_def = train_step.get_concrete_function(iterator).graph.as_graph_def()
    op_types = [node.op for node in graph_def.node]
    op_types += [node.op for function in graph_def.library.function for node in function.node_def]
    return sum(op_type in COLLECTIVE_OPS for op_type in op_types)


def measure_variant(
    exchange: Any,
    model: str,
    variant: str,
    steps: int,
    warmup_steps: int,
    averagings: int,
    batch_size: int,
) -> dict[str, Any]:
    """Time one variant's training step and one averaging of its moving statistics (a rank)."""
    import numpy as np

    from globaldl.monitoring import NullObserver
    from globaldl.run_record import RunTotals
    from globaldl.settings import TrainSettings
    from globaldl.trainer import Trainer

    settings = TrainSettings(
        model="resnet",
        depth=RESNET_DEPTHS_BY_NAME[model],
        dataset="cifar-synthetic",
        batch_size=batch_size,
        batch_norm=variant,
        run_id="bench-batchnorm",
    )
    trainer = Trainer(settings, exchange)
    iterator = iter(trainer.pipeline.train_batches(0).repeat())
    observer, totals, epoch_totals = NullObserver(), RunTotals(), np.zeros(3)
    for _ in range(warmup_steps):  # the first traces the step
        trainer.run_step(iterator, observer, totals, epoch_totals)
    step_seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.run_step(iterator, observer, totals, epoch_totals)
        step_seconds.append(time.perf_counter() - started)
    averaging_seconds, averaging_collectives = [], 0
    for _ in range(averagings):
        started = time.perf_counter()
        averaging_collectives = exchange.average_variables(trainer.local_statistics, "bench_avg")
        averaging_seconds.append(time.perf_counter() - started)
    return {
        "model": model,
        "variant": variant,
        "batch_norm_layers": len(trainer.local_statistics) // 2,
        "collectives_per_step": collectives_per_step(trainer._train_step, iterator),
        "step_seconds": statistics.median(step_seconds),
        "averaging_seconds": statistics.median(averaging_seconds),
        "averaging_collectives": averaging_collectives,
    }


def _worker_main(argv: Sequence[str] | None = None) -> None:
    """One rank of a launch: every model and variant, in the order given; rank 0 writes JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--order", required=True, help="model:variant,... in measuring order")
    for option in ("--steps", "--warmup-steps", "--averagings", "--batch-size"):
        parser.add_argument(option, type=int, required=True)
    args = parser.parse_args(argv)
    from globaldl.exchange import Exchange

    exchange = Exchange()
    rows = []
    for item in args.order.split(","):
        model, variant = item.split(":")
        rows.append(
            measure_variant(
                exchange,
                model,
                variant,
                args.steps,
                args.warmup_steps,
                args.averagings,
                args.batch_size,
            )
        )
    if exchange.rank == 0:
        from globaldl.summary import write_json_atomically

        write_json_atomically(args.out, {"ranks": exchange.size, "rows": rows})


if __name__ == "__main__":
    _worker_main()
