"""The gradient exchange: the only module that calls Horovod's collectives.

Everything that crosses the network goes through `Exchange`: the initial broadcast, the
collective(s) of each training step that carry the compressed gradients, the small reductions
that average validation results, and the averaging of what each rank's forward pass updates on
its own (batch normalisation's moving statistics) at epoch ends and commits. What a step's
collective is follows from the compressor's `WireSpec` alone (`Combine.SUM` goes through
allreduce in the declared dtype, `Combine.GATHER` through allgather), never from a codec's name
or settings; a declaration the exchange cannot honour is refused when the run is built
(`check_wire_spec`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from globaldl.collectives import CollectiveLedger, tx_bytes_per_wire_byte
from globaldl.compression import Combine, WireSpec
from globaldl.hierarchy import Hierarchy

SUMMABLE_DTYPES = ("uint8", "int8", "int32", "int64", "float16", "float32", "float64")
"""The dtypes Horovod 0.28.1 can allreduce from TensorFlow with Gloo. Gloo itself sums int16
and uint16 too, but the `HorovodAllreduce` TensorFlow op is registered only for these (read from
the op's definition); a SUM payload must declare one of them."""

GATHERABLE_DTYPES = (*SUMMABLE_DTYPES, "uint16", "int16")
"""The dtypes the `HorovodAllgather` TensorFlow op accepts (bool aside)."""

LENGTH_BYTES = 4
"""A variable-length payload's int32 byte length, gathered before the payload itself."""


class WireSpecError(ValueError):
    """A compressor declared something the exchange cannot honour; the message says what."""


def check_wire_spec(spec: WireSpec, hierarchy: str = "none") -> WireSpec:
    """Return ``spec`` if the exchange can move such payloads; raise WireSpecError otherwise.

    Refused: an unknown combine; no rounds; a length that is negative or not a whole number
    of elements; SUM in a dtype Horovod cannot allreduce; GATHER over more than one round (a
    later round would need every rank's earlier payload decoded first); GATHER with
    ``hierarchy="sites"`` (a site leader can forward a sum, not decode and re-encode every
    member's buffer).
    """
    if not isinstance(spec, WireSpec):
        raise WireSpecError(f"wire spec {spec!r} is not a WireSpec")
    if not isinstance(spec.combine, Combine):
        raise WireSpecError(
            f"wire spec combine={spec.combine!r} is not one of {[c.value for c in Combine]}"
        )
    allowed = SUMMABLE_DTYPES if spec.combine is Combine.SUM else GATHERABLE_DTYPES
    if spec.dtype not in allowed:
        raise WireSpecError(
            f"wire spec dtype={spec.dtype!r} cannot be {spec.combine.value}med by Horovod "
            f"0.28.1 over Gloo; allowed: {list(allowed)}"
        )
    if spec.rounds == 0:
        raise WireSpecError("wire spec round_bytes=() declares no payload at all")
    for number, length in enumerate(spec.round_bytes):
        if length is None:
            continue
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise WireSpecError(
                f"wire spec round {number} length {length!r} is not a byte count >= 0"
            )
        if length % spec.element_bytes:
            raise WireSpecError(
                f"wire spec round {number} length {length} bytes is not a whole number of "
                f"{spec.dtype} elements ({spec.element_bytes} bytes each)"
            )
    if spec.combine is Combine.GATHER and spec.rounds > 1:
        raise WireSpecError(
            f"wire spec declares GATHER over {spec.rounds} rounds; only SUM payloads may take "
            "more than one round"
        )
    if spec.combine is Combine.GATHER and hierarchy != "none":
        raise WireSpecError(
            f"hierarchy={hierarchy!r} sums payloads site by site, but this codec's payloads "
            "are gathered (combine=gather); choose a prune and quantize whose payloads sum "
            "(e.g. prune none, shared-randomk, shared-topk or powersgd with quantize none, "
            "fp16 or intsum)"
        )
    return spec


def check_payload(payload: tf.Tensor, spec: WireSpec, round_index: int = 0) -> int | None:
    """Refuse (WireSpecError) a payload its declaration does not describe; its declared bytes.

    Checked while the step is traced, from static shapes: a 1-D vector of the declared dtype,
    of the declared length when that is fixed.
    """
    check_wire_spec(spec)
    round_bytes = spec.round_bytes[round_index]
    if payload.dtype.name != spec.dtype or payload.shape.rank != 1:
        raise WireSpecError(
            f"payload {payload.dtype.name}{payload.shape.as_list()} does not match its "
            f"declaration: a 1-D {spec.dtype} vector"
        )
    static_elements = payload.shape.num_elements()
    if round_bytes is not None and static_elements is not None:
        if static_elements * payload.dtype.size != round_bytes:
            raise WireSpecError(
                f"payload of {static_elements * payload.dtype.size} bytes does not match "
                f"its declared fixed length of {round_bytes} bytes"
            )
    return round_bytes


def device_tx_bytes_per_step_model(
    spec: WireSpec,
    num_ranks: int,
    payload_bytes_per_step: float,
    hierarchy: Hierarchy | None = None,
) -> float:
    """Bytes one device sends per step by the collectives' algorithms (Gloo's rings).

    ``payload_bytes_per_step`` is what one rank hands to the collectives per step (all rounds,
    and a varying length's 4 bytes), as measured. A ring allreduce of P bytes sends
    2 (N - 1) / N * P per device (reduce-scatter, then allgather); a ring allgather forwards
    every other rank's buffer once: (N - 1) * P when all buffers are about P long. With a
    site hierarchy it is what a site leader sends, the busiest device (Hierarchy).
    """
    if num_ranks <= 1:
        return 0.0
    if hierarchy is not None:
        return hierarchy.leader_tx_bytes(payload_bytes_per_step)
    return tx_bytes_per_wire_byte(spec.combine.value, num_ranks) * payload_bytes_per_step


def dense_device_tx_bytes_per_step_model(raw_bytes_per_step: int, num_ranks: int) -> float:
    """The same model for dense fp32 ring allreduce of the same gradients on as many ranks."""
    return tx_bytes_per_wire_byte(Combine.SUM.value, num_ranks) * raw_bytes_per_step


def collectives_per_step(spec: WireSpec, hierarchy: Hierarchy | None = None) -> int:
    """Collectives one device runs per training step for payloads declared by ``spec``.

    With a site hierarchy, what a site leader runs: per round a sum in its site (if it has
    company), one among the leaders (if there are several sites), a broadcast in its site.
    """
    if spec.combine is Combine.GATHER:
        # A varying length travels in its own small allgather first.
        return spec.rounds * (1 if spec.fixed_length else 2)
    if hierarchy is None:
        return spec.rounds
    return spec.rounds * hierarchy.collectives_per_round


@dataclass(frozen=True)
class Exchanged:
    """What one rank receives from a step's collective."""

    payload: tf.Tensor  # SUM: the element-wise sum of every rank's payload; GATHER: all buffers
    lengths: tf.Tensor  # GATHER: int32 elements in each rank's buffer (bytes for uint8); SUM: empty
    wire_bytes: tf.Tensor  # int64: bytes this rank handed to collectives for this step


class Exchange:
    """Horovod, initialised once per process; identity of this rank and its collectives.

    ``dynamic_process_sets`` lets `use_sites` add the site process sets after start-up
    (Horovod's HOROVOD_DYNAMIC_PROCESS_SETS): which rank sits in which site is only known
    once every rank has reported its site, i.e. after `hvd.init`.
    """

    def __init__(self, dynamic_process_sets: bool = False) -> None:
        import horovod.tensorflow as hvd

        self._hvd = hvd
        hvd.init(process_sets="dynamic" if dynamic_process_sets else None)
        # When Horovod's background loop (and its coordination traffic) started: unix seconds.
        self.started_unix_seconds = time.time()
        self.ledger = CollectiveLedger()
        self.hierarchy: Hierarchy | None = None
        self._site_set: Any = None
        self._leader_set: Any = None

    def use_sites(self, own_site: str) -> Hierarchy:
        """Sum SUM payloads site by site from now on (see globaldl.hierarchy); collective.

        Every rank reports its site; each site with more than one rank gets a process set,
        and so do the leaders when there is more than one site. A set holding every rank is
        the global set (Horovod refuses a duplicate). Every rank registers the same sets in
        the same order, as `hvd.add_process_set` requires.
        """
        hierarchy = Hierarchy.from_site_names(self.gather_text(own_site, "site_names"), self.rank)
        everyone = tuple(range(self.size))

        def process_set(ranks: tuple[int, ...]) -> Any:
            if len(ranks) <= 1:
                return None
            if ranks == everyone:
                return self._hvd.global_process_set
            return self._hvd.add_process_set(list(ranks))

        site_sets = {site: process_set(site) for site in hierarchy.sites}
        self._site_set = site_sets[hierarchy.own_site]
        leader_set = process_set(hierarchy.leaders)
        self._leader_set = leader_set if hierarchy.is_leader else None
        self.hierarchy = hierarchy
        return hierarchy

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

    def _sum_by_site(self, payload: tf.Tensor, name: str) -> tf.Tensor:
        """Sum in the site, then among the leaders, then back to the site (three collectives)."""
        hvd, hierarchy = self._hvd, self.hierarchy
        assert hierarchy is not None
        summed = payload
        if self._site_set is not None:
            summed = hvd.allreduce(
                summed, op=hvd.Sum, name=f"{name}_site", process_set=self._site_set
            )
        if self._leader_set is not None:
            summed = hvd.allreduce(
                summed, op=hvd.Sum, name=f"{name}_leaders", process_set=self._leader_set
            )
        if self._site_set is not None:
            summed = hvd.broadcast(
                summed, root_rank=hierarchy.leader, name=f"{name}_back", process_set=self._site_set
            )
        return summed

    def broadcast_variables(self, variables: list[tf.Variable], root_rank: int = 0) -> None:
        """Overwrite every rank's variables with the root's (initial state, resumed state)."""
        if variables:
            for variable in variables:
                self._record("broadcast", variable, root_rank)
            self._hvd.broadcast_variables(variables, root_rank=root_rank)

    def broadcast_value(self, value: tf.Tensor, name: str, root_rank: int = 0) -> tf.Tensor:
        """Send one tensor from the root to every rank."""
        self._record("broadcast", value, root_rank)
        return self._hvd.broadcast(value, root_rank=root_rank, name=name)

    def broadcast_object(self, value: Any, name: str, root_rank: int = 0) -> Any:
        """Send a picklable Python object from the root to every rank (elastic state).

        Not in the ledger: only the root knows the pickled size before the call.
        """
        return self._hvd.broadcast_object(value, root_rank=root_rank, name=name)

    def restart(self) -> None:
        """Leave the current ring and join the next one (an elastic membership change)."""
        self._hvd.shutdown()
        self._hvd.init()

    def sum_across_ranks(self, value: tf.Tensor, name: str) -> tf.Tensor:
        """Element-wise sum of a small tensor over all ranks (validation totals, flags)."""
        self._record("allreduce", value)
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
        self._record("allgather", value)
        return self._hvd.allgather(value, name=name)

    def gather_text(self, text: str, name: str, max_bytes: int = 128) -> list[str]:
        """Every rank's short string (a device name, a digest), in rank order."""
        encoded = text.encode()[:max_bytes].ljust(max_bytes, b"\0")
        own = tf.constant(list(encoded), dtype=tf.uint8)
        self._record("allgather", own)
        gathered = self._hvd.allgather(own, name=name).numpy().reshape(self.size, max_bytes)
        return [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in gathered]

    def _record(self, op: str, value: tf.Tensor | tf.Variable, root_rank: int = 0) -> None:
        """Count one eager collective in the ledger (the byte accounting models it per rank)."""
        element_bytes = value.dtype.size
        self.ledger.record(
            op, int(value.shape.num_elements()) * element_bytes, element_bytes, root=root_rank
        )

    def exchange_payload(
        self, payload: tf.Tensor, spec: WireSpec, round_index: int = 0
    ) -> Exchanged:
        """Run one round's gradient collective, as ``spec`` declares it; traced in the step.

        SUM payloads are summed by allreduce, in their declared dtype. GATHER payloads are one
        buffer per rank, allgathered; when the declared length varies from step to step, the
        per-rank lengths travel in a second, 4-byte allgather first, and those bytes are
        counted on the wire too.
        """
        round_bytes = check_payload(payload, spec, round_index)
        wire_bytes = tf.cast(tf.size(payload), tf.int64) * payload.dtype.size
        if spec.combine is Combine.SUM:
            if self.hierarchy is not None:
                check_wire_spec(spec, "sites")
                summed = self._sum_by_site(payload, f"gradients_round{round_index}")
            else:
                summed = self._hvd.allreduce(
                    payload, op=self._hvd.Sum, name=f"gradients_round{round_index}"
                )
            return Exchanged(summed, tf.zeros([0], tf.int32), wire_bytes)
        if self.hierarchy is not None:
            check_wire_spec(spec, "sites")
        if round_bytes is not None:
            elements = round_bytes // spec.element_bytes
            lengths = tf.fill([self.size], tf.constant(elements, tf.int32))
        else:
            own_length = tf.reshape(tf.size(payload, out_type=tf.int32), [1])
            lengths = self._hvd.allgather(own_length, name="gradient_lengths")
            wire_bytes += LENGTH_BYTES
        gathered = self._hvd.allgather(payload, name="gradients")
        return Exchanged(gathered, lengths, wire_bytes)
