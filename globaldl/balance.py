"""`--balance speed`: each device's local batch in proportion to its measured speed.

With equal shares every device computes the same local batch, and a synchronous step lasts as
long as the slowest device takes: on a fleet where some devices have a quarter of the CPU, the
fast ones spend most of each step waiting. With `--balance speed`:

1. Before training, every rank times its forward and backward pass on a few batches of its own
   data for about two seconds, with no exchange (the network must not count), after one
   untimed warm-up batch. A shorter probe misjudges a CPU-limited device: a cgroup quota lets
   it run at full speed until the quota of each 100 ms period is spent (measured: 8 batches
   of LeNet rated two identical 0.8-core devices 1207 and 589 examples/s).
2. The ranks share their speeds (examples per second) and split the global batch
   (local batch x ranks) in proportion: rank i gets b_i examples per step, at least 1
   (`split_batch`). Its share of the data is proportional to b_i too, so every rank still
   runs the same number of steps per epoch.
3. Each rank multiplies its gradient (a mean over its b_i examples) by b_i x N / B, where B is
   the global batch, before compression. The exchange averages over the N ranks, so the
   update is sum_i b_i g_i / B: the mean gradient over all B examples of the step, exactly
   what one device training on the whole global batch would compute.

The wimpy-nodes paper (seeds.md, 004) weights each node's contribution by its run time
relative to the others. Weighting equal batches by speed changes which examples count for how
much; here the speed decides how MANY examples a device computes, and the weights (sample
counts) keep every example's gradient at the same weight, so the update stays unbiased.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `split_batch` serves the simulator too, which loads no TensorFlow
    import tensorflow as tf

# What every rank times, after one warm-up batch: these batches, repeated until this many
# seconds have passed (a CPU quota shows only over many 100 ms periods).
PROBE_BATCHES = 8
PROBE_SECONDS = 2.0


def split_batch(global_batch: int, speeds: Sequence[float]) -> tuple[int, ...]:
    """Split `global_batch` examples across ranks in proportion to `speeds`, each at least 1.

    Largest-remainder rounding: every rank gets floor(its exact share) (at least 1), then the
    ranks with the largest fractional parts get one more until the total is `global_batch`.

    >>> split_batch(64, [4.0, 4.0, 1.0, 1.0])
    (26, 26, 6, 6)
    """
    count = len(speeds)
    if count < 1:
        raise ValueError("split_batch needs the speed of at least one rank")
    if not all(math.isfinite(speed) and speed > 0 for speed in speeds):
        raise ValueError(f"speeds must be finite and > 0 examples/s, got {list(speeds)!r}")
    if global_batch < count:
        raise ValueError(
            f"a global batch of {global_batch} cannot give each of {count} ranks an example"
        )
    total = sum(speeds)
    exact = [global_batch * speed / total for speed in speeds]
    sizes = [max(1, math.floor(share)) for share in exact]
    # Hand out what is left, largest fractional part first (ties: lower rank first)...
    by_remainder = sorted(range(count), key=lambda i: (math.floor(exact[i]) - exact[i], i))
    for index in by_remainder[: max(0, global_batch - sum(sizes))]:
        sizes[index] += 1
    # ...or, where the minimum of 1 overshot, take back from the largest shares.
    while sum(sizes) > global_batch:
        sizes[sizes.index(max(sizes))] -= 1
    return tuple(sizes)


def gradient_weight(batch_sizes: Sequence[int], rank: int) -> float:
    """The factor on rank `rank`'s mean gradient that makes the ranks' average the true mean."""
    return batch_sizes[rank] * len(batch_sizes) / sum(batch_sizes)


def measure_speed(
    model: Any,
    loss_fn: Any,
    variables: Sequence[tf.Variable],
    batches: Iterable[Any],
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Examples per second of `model`'s forward and backward pass over `batches` (no exchange).

    The first of `batches` (images, labels) traces and warms up, untimed; the others are timed,
    repeated for at least PROBE_SECONDS by `clock` and at least once each.
    """
    import tensorflow as tf

    @tf.function(autograph=False)
    def forward_backward(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        gradients = tape.gradient(loss, variables)
        return tf.add_n([tf.reduce_sum(g) for g in gradients if g is not None])

    warm_up, *timed = list(batches)
    if not timed:
        raise ValueError("measure_speed needs at least two batches: one to warm up, one to time")
    forward_backward(*warm_up).numpy()
    done, examples, started = 0, 0, clock()
    # Long enough to span many CPU-quota periods (a cgroup-limited device runs at full
    # speed until its quota for the period is spent), and at least one pass over the batches.
    while done < len(timed) or clock() - started < PROBE_SECONDS:
        images, labels = timed[done % len(timed)]
        forward_backward(images, labels).numpy()
        examples += int(labels.shape[0])
        done += 1
    return examples / max(clock() - started, 1e-9)
