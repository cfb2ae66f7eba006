"""The gradient exchange: the only module that calls Horovod's collectives.

Everything that crosses the network goes through `Exchange`: the initial broadcast, the one
collective per training step that carries the compressed gradients, the small reductions
that average validation results, and the averaging of what each rank's forward pass updates
on its own (batch normalisation's moving statistics) at epoch ends and commits. The step's
collective is chosen from what the codec declares (`Combine.SUM` goes through allreduce,
`Combine.GATHER` through allgather), never from its name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from globaldl.compression import Combine, GradientCompressor


@dataclass(frozen=True)
class Exchanged:
    """What one rank receives from a step's collective."""

    payload: tf.Tensor  # SUM: the element-wise sum of every rank's payload; GATHER: all buffers
    lengths: tf.Tensor  # GATHER: int32 byte length of each rank's buffer; SUM: empty
    wire_bytes: tf.Tensor  # int64: bytes this rank handed to collectives for this step


class Exchange:
    """Horovod, initialised once per process; identity of this rank and its collectives."""

    def __init__(self) -> None:
        import horovod.tensorflow as hvd

        self._hvd = hvd
        hvd.init()

    @property
    def rank(self) -> int:
        """The rank of this worker, 0..size-1."""
        return int(self._hvd.rank())

    @property
    def size(self) -> int:
        """Number of workers in the ring."""
        return int(self._hvd.size())

    @property
    def local_rank(self) -> int:
        """The rank of this worker among the workers on its host."""
        return int(self._hvd.local_rank())

    @property
    def local_size(self) -> int:
        """Number of workers on this worker's host."""
        return int(self._hvd.local_size())

    def broadcast_variables(self, variables: list[tf.Variable], root_rank: int = 0) -> None:
        """Overwrite every rank's variables with the root's (initial state, resumed state)."""
        if variables:
            self._hvd.broadcast_variables(variables, root_rank=root_rank)

    def broadcast_value(self, value: tf.Tensor, name: str, root_rank: int = 0) -> tf.Tensor:
        """Send one tensor from the root to every rank."""
        return self._hvd.broadcast(value, root_rank=root_rank, name=name)

    def broadcast_object(self, value: Any, name: str, root_rank: int = 0) -> Any:
        """Send a picklable Python object from the root to every rank (elastic state)."""
        return self._hvd.broadcast_object(value, root_rank=root_rank, name=name)

    def restart(self) -> None:
        """Leave the current ring and join the next one (an elastic membership change)."""
        self._hvd.shutdown()
        self._hvd.init()

    def sum_across_ranks(self, value: tf.Tensor, name: str) -> tf.Tensor:
        """Element-wise sum of a small tensor over all ranks (validation totals, flags)."""
        return self._hvd.allreduce(value, op=self._hvd.Sum, name=name)

    def average_variables(self, variables: Sequence[tf.Variable], name: str) -> int:
        """Set every rank's `variables` to their mean over all ranks; return the collectives run.

        The variables travel flattened into one buffer per dtype, so a model's whole set of
        moving statistics costs one allreduce (one round trip on a high-latency link), not one
        per layer. Allreduce hands every rank the same sum, so afterwards every rank holds
        bitwise the same values. Only floating-point variables can be averaged.
        """
        by_dtype: dict[tf.DType, list[tf.Variable]] = {}
        for variable in variables:
            if not variable.dtype.is_floating:
                raise ValueError(
                    f"variable {variable.name} has dtype {variable.dtype.name}; only "
                    "floating-point variables can be averaged across ranks"
                )
            by_dtype.setdefault(variable.dtype, []).append(variable)
        if self.size == 1:
            return 0
        for dtype, group in by_dtype.items():
            flat = tf.concat([tf.reshape(variable, [-1]) for variable in group], axis=0)
            averaged = self._hvd.allreduce(flat, op=self._hvd.Average, name=f"{name}_{dtype.name}")
            sizes = [int(tf.size(variable)) for variable in group]
            for variable, part in zip(group, tf.split(averaged, sizes), strict=True):
                variable.assign(tf.reshape(part, variable.shape))
        return len(by_dtype)

    def sync_batch_normalization(self) -> type:
        """Horovod's SyncBatchNormalization layer class (a tf-keras BatchNormalization).

        In training it replaces each rank's batch mean and variance by the mean over all ranks
        (one allreduce per layer in the forward pass, and one more in the backward pass).
        """
        return self._hvd.SyncBatchNormalization

    def gather_across_ranks(self, value: tf.Tensor, name: str) -> tf.Tensor:
        """Concatenate every rank's tensor along the first axis, in rank order."""
        return self._hvd.allgather(value, name=name)

    def gather_text(self, text: str, name: str, max_bytes: int = 128) -> list[str]:
        """Every rank's short string (a device name, a digest), in rank order."""
        encoded = text.encode()[:max_bytes].ljust(max_bytes, b"\0")
        own = tf.constant(list(encoded), dtype=tf.uint8)
        gathered = self._hvd.allgather(own, name=name).numpy().reshape(self.size, max_bytes)
        return [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in gathered]

    def exchange_payload(self, payload: tf.Tensor, compressor: GradientCompressor) -> Exchanged:
        """Run the step's single gradient collective; traced inside the training step.

        SUM payloads (dense fp32 or fp16) are summed by allreduce. GATHER payloads are one
        fused uint8 buffer per rank, allgathered; when the codec's buffer length varies from
        step to step, the per-rank lengths travel in a second, 4-byte allgather first, and
        those bytes are counted on the wire too.
        """
        wire_bytes = compressor.wire_bytes(payload)
        if compressor.combine is Combine.SUM:
            summed = self._hvd.allreduce(payload, op=self._hvd.Sum, name="gradients")
            return Exchanged(summed, tf.zeros([0], tf.int32), wire_bytes)
        if compressor.fixed_payload_bytes is not None:
            lengths = tf.fill([self.size], tf.constant(compressor.fixed_payload_bytes, tf.int32))
        else:
            own_length = tf.reshape(tf.size(payload, out_type=tf.int32), [1])
            lengths = self._hvd.allgather(own_length, name="gradient_lengths")
            wire_bytes += 4
        gathered = self._hvd.allgather(payload, name="gradients")
        return Exchanged(gathered, lengths, wire_bytes)
