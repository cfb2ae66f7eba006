"""The training loop: builds a run from settings, trains epoch by epoch, writes the summary.

The step itself (data_load, compute, compress, exchange, decompress, apply, each timed) is
built in `globaldl/step.py`; this module owns everything around it: input, model, optimizer,
the compressor's state, checkpoints, validation and metrics. What the run adds up, and the
summary made of it, are `globaldl/run_record.py`'s.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras

from globaldl import checkpoint, schedules, summary
from globaldl.balance import PROBE_BATCHES, gradient_weight, measure_speed, split_batch
from globaldl.compression import GradientCompressor
from globaldl.exchange import (
    Exchange,
    check_wire_spec,
)
from globaldl.local_sgd.engine import RoundEngine, build_round_engine
from globaldl.local_sgd.local_step import build_local_step
from globaldl.models import build_model
from globaldl.monitoring import PHASES, NullObserver, TrainingObserver, start_exporter
from globaldl.optimizers import make_optimizer, optimizer_variables
from globaldl.pipelines import InputPipeline, make_pipeline
from globaldl.pipelines.release import release_in_background
from globaldl.progress import EpochProgress, NoProgress
from globaldl.run_record import EpochResult, RunTotals, run_summary
from globaldl.settings import SettingsError, TrainSettings
from globaldl.sites import load_site_map, own_names
from globaldl.step import CORRECT, LOSS, SKIPPED, WIRE_BYTES, StepParts, build_train_step

log = logging.getLogger(__name__)


def _configure_threads(local_size: int) -> None:
    """Share the machine's cores between the ranks that run on it (once per process).

    TensorFlow fixes its thread pools when its runtime starts; an elastic worker that builds a
    second trainer after a membership change keeps the pools it has. TensorFlow's own
    TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS win over the even split (a fleet of
    fractional-core devices may run single-threaded runtimes).
    """
    if tf.config.threading.get_intra_op_parallelism_threads() != 0:
        return
    cores = os.cpu_count() or 1
    intra = os.environ.get("TF_NUM_INTRAOP_THREADS")
    inter = os.environ.get("TF_NUM_INTEROP_THREADS")
    try:
        tf.config.threading.set_intra_op_parallelism_threads(
            int(intra) if intra else max(1, cores // max(1, local_size))
        )
        tf.config.threading.set_inter_op_parallelism_threads(int(inter) if inter else 2)
    except RuntimeError:
        # The runtime already started in this process (a trainer built inside a larger
        # program or a test session): it keeps the pools it started with.
        log.info("TensorFlow is already running; its thread pools stay as they are")


class Trainer:
    """Builds everything a run needs from settings, then trains epoch by epoch."""

    def __init__(
        self, settings: TrainSettings, exchange: Exchange | None = None, phase_timing: bool = True
    ) -> None:
        self.settings = settings
        self.phase_timing = phase_timing
        self.exchange = exchange or Exchange(dynamic_process_sets=settings.hierarchy == "sites")
        _configure_threads(self.exchange.local_size)
        self.rank, self.size = self.exchange.rank, self.exchange.size
        self.device = settings.device or socket.gethostname()
        # An elastic run's ranks come and go with its devices: there a missing rank is no error.
        delay_rank = settings.input_delay_rank
        if delay_rank is not None and delay_rank >= self.size and not settings.elastic:
            raise SettingsError(
                f"input_delay_rank {delay_rank} is not allowed; the run's ranks "
                f"are 0..{self.size - 1}"
            )
        keras.utils.set_random_seed(settings.seed)
        self.pipeline: InputPipeline = self._make_pipeline(None)
        spec = self.pipeline.spec
        batch_norm = None
        if settings.batch_norm == "sync":
            # Horovod's layer refuses fused kernels (it overrides the unfused moments).
            batch_norm = functools.partial(self.exchange.sync_batch_normalization(), fused=False)
        self.model = build_model(
            settings.model,
            input_shape=spec.input_shape,
            num_classes=spec.num_classes,
            resnet_depth=settings.depth,
            mlp_layers=settings.layers,
            mlp_width=settings.width,
            seed=settings.seed,
            batch_norm=batch_norm,
        )
        self.model(tf.zeros((1, *spec.input_shape)), training=False)
        # What each rank's forward pass updates from its own batches (batch normalisation's
        # moving mean and variance): averaged across ranks at every synchronisation point.
        self.local_statistics = list(self.model.non_trainable_variables)
        self._statistics_in_sync = True
        self.variables = list(self.model.trainable_variables)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        # Local batch of every rank: equal shares, or in proportion to measured speed.
        self.rank_batch_sizes: tuple[int, ...] = (settings.batch_size,) * self.size
        self.measured_speeds: list[float] | None = None
        if settings.balance == "speed" and self.size > 1:
            self._balance_by_speed()
        self.batch_size = self.rank_batch_sizes[self.rank]
        self.global_batch_size = sum(self.rank_batch_sizes)
        self.steps_per_epoch = self.pipeline.steps_per_epoch
        if settings.max_steps_per_epoch is not None:
            self.steps_per_epoch = min(self.steps_per_epoch, settings.max_steps_per_epoch)
        self.compressor = GradientCompressor(
            settings.compression,
            self.variables,
            steps_per_epoch=self.steps_per_epoch,
            rank=self.rank,
            num_ranks=self.size,
        )
        self.wire_spec = check_wire_spec(self.compressor.wire_spec, settings.hierarchy)
        if settings.hierarchy == "sites" and self.exchange.hierarchy is None:
            assert settings.sites_file is not None
            site = load_site_map(settings.sites_file).site_of(own_names())
            self.exchange.use_sites(site)
        self.learning_rate = settings.learning_rate * (self.size if settings.scale_lr else 1)
        self.optimizer = make_optimizer(
            settings,
            schedules.learning_rate(
                self.learning_rate,
                warmup_epochs=settings.lr_warmup_epochs,
                decay=settings.lr_decay,
                steps_per_epoch=self.steps_per_epoch,
                epochs=settings.epochs,
            ),
            self.compressor,
        )
        self.optimizer.build(self.variables)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        # Rounds of local steps (--sync-every > 1); None is the per-step exchange.
        self.rounds: RoundEngine | None = None
        if not settings.sync_interval.per_step:
            self.rounds = build_round_engine(self)
        shared: dict[str, Any] = {"rounds": self.rounds.checkpoint()} if self.rounds else {}
        self.shared_state = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            step=self.step,
            epoch=self.epoch,
            **{
                f"compressor_{index}": v
                for index, v in enumerate(self.compressor.shared_state_variables)
            },
            **shared,
        )
        self.local_state = tf.train.Checkpoint(
            **{
                f"compressor_{index}": v
                for index, v in enumerate(self.compressor.local_state_variables)
            },
            **{f"local_{index}": v for index, v in enumerate(self.own_round_variables())},
        )
        self._train_step = self._build_train_step()

    def own_round_variables(self) -> list[tf.Variable]:
        """In rounds, what differs between devices inside a round: weights, inner optimizer."""
        if self.rounds is None:
            return []
        return [*self.model.variables, *optimizer_variables(self.optimizer)]

    # ----------------------------------------------------------------- input and balance
    def _make_pipeline(self, rank_batch_sizes: tuple[int, ...] | None) -> InputPipeline:
        """The rank's input: equal local batches, or every rank's own (`--balance speed`)."""
        settings = self.settings
        return make_pipeline(
            settings.dataset,
            rank=self.rank,
            num_ranks=self.size,
            batch_size=settings.batch_size
            if rank_batch_sizes is None
            else rank_batch_sizes[self.rank],
            seed=settings.seed,
            data_dir=settings.data_dir,
            input_delay_ms=settings.input_delay_ms
            if settings.input_delay_rank in (None, self.rank)
            else 0.0,
            rank_batch_sizes=rank_batch_sizes,
        )

    def _balance_by_speed(self) -> None:
        """Time this rank's compute, share the speeds, take a batch in proportion (balance.py)."""
        speed = self._measure_speed()
        speeds = self.exchange.gather_across_ranks(
            tf.constant([speed], tf.float64), "balance_speeds"
        )
        self.measured_speeds = [float(value) for value in speeds.numpy()]
        self.rank_batch_sizes = split_batch(
            self.settings.batch_size * self.size, self.measured_speeds
        )
        self.pipeline = self._make_pipeline(self.rank_batch_sizes)
        if self.rank == 0:
            print(
                "balance speed: examples/s per rank "
                + ", ".join(f"{value:.0f}" for value in self.measured_speeds)
                + " -> local batches "
                + ", ".join(str(size) for size in self.rank_batch_sizes),
                flush=True,
            )

    def _measure_speed(self) -> float:
        """Examples per second of this rank's forward and backward pass (no exchange)."""
        batches = self.pipeline.train_batches(0).take(PROBE_BATCHES + 1)
        return measure_speed(self.model, self.loss_fn, self.variables, batches)

    # ----------------------------------------------------------------- the step
    def _build_train_step(self) -> Callable[[Any], tf.Tensor]:
        # In rounds, the sample weight applies to the round's delta, not to every gradient.
        weight = gradient_weight(self.rank_batch_sizes, self.rank) if self.rounds is None else 1.0
        build = build_train_step if self.rounds is None else build_local_step
        return build(
            StepParts(
                model=self.model,
                variables=self.variables,
                loss_fn=self.loss_fn,
                optimizer=self.optimizer,
                compressor=self.compressor,
                exchange=self.exchange,
                step=self.step,
                num_ranks=self.size,
                rank=self.rank,
                gradient_weight=weight,
                inject_nan_step=self.settings.inject_nan_step,
                inject_nan_rank=self.settings.inject_nan_rank,
            ),
            phase_timing=self.phase_timing,
        )

    @tf.function(autograph=False)
    def _validation_step(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        logits = self.model(images, training=False)
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)
        return tf.stack(
            [
                tf.reduce_sum(tf.cast(losses, tf.float64)),
                tf.reduce_sum(tf.cast(correct, tf.float64)),
                tf.cast(tf.size(labels), tf.float64),
            ]
        )

    # ----------------------------------------------------------------- state
    def synchronise_local_statistics(self) -> None:
        """Average the moving statistics over all ranks, unless no step ran since the last time.

        Every rank's batch normalisation updates its moving mean and variance from its own batches,
        so after one step the ranks hold different values (the trainable weights stay identical: the
        averaged gradient updates them). Called before validation, checkpoints and the final weight
        digest (end_epoch, run_record.run_summary) and at every elastic commit: one fused allreduce
        each time, none per step, none for a model without such variables.
        """
        if not self._statistics_in_sync:
            self.exchange.average_variables(self.local_statistics, "local_statistics")
            self._statistics_in_sync = True

    def _broadcast_shared_state(self) -> None:
        shared = [
            *self.model.variables,
            *optimizer_variables(self.optimizer),
            *self.compressor.shared_state_variables,
            self.step,
            self.epoch,
            *(self.rounds.shared_variables() if self.rounds else []),
        ]
        self.exchange.broadcast_variables(shared, root_rank=0)

    def _start(self) -> int:
        """Every rank takes rank 0's state: fresh, or the newest good checkpoint's (--resume).

        The shared part comes from rank 0 (restored there, then broadcast); each rank's own
        part (compression residuals; in rounds, its weights and inner optimizer) from its own
        checkpoint, after the broadcast. Returns the epoch to continue from.
        """
        directory = self.settings.checkpoint_dir
        epoch = -1
        if self.settings.resume:
            assert directory is not None
            found = checkpoint.latest_good(directory) if self.rank == 0 else None
            epoch = -1 if found is None else found[0]
            if self.rank == 0 and epoch >= 0:
                checkpoint.restore(directory, epoch, self.shared_state)
            epoch = int(self.exchange.broadcast_value(tf.constant(epoch, tf.int64), "resume_epoch"))
            if epoch < 0 and self.rank == 0:
                log.warning("no usable checkpoint in %s; starting from scratch", directory)
        self._broadcast_shared_state()
        if epoch < 0:
            if self.rounds is not None:
                self.rounds.start()
            return 0
        assert directory is not None
        own_state_found = True
        try:
            checkpoint.restore(checkpoint.rank_dir(directory, self.rank), epoch, self.local_state)
        except checkpoint.CheckpointError as error:
            # A device that never held this rank (or lost its disk) starts its residuals at
            # zero: what it had not yet sent is lost, which error feedback tolerates.
            log.warning("rank %d: %s; its own state starts afresh", self.rank, error)
            own_state_found = False
        if self.rounds is not None:
            self.rounds.after_restore(int(self.step.numpy()), own_state_found)
        return epoch

    def _save(self, epoch: int) -> None:
        directory = self.settings.checkpoint_dir
        assert directory is not None
        self.epoch.assign(epoch)
        metadata = {"step": int(self.step.numpy()), "ranks": self.size}
        if self.compressor.local_state_variables or self.rounds is not None:
            checkpoint.save(
                checkpoint.rank_dir(directory, self.rank), epoch, self.local_state, metadata
            )
        if self.rank == 0:
            checkpoint.save(directory, epoch, self.shared_state, metadata)

    # ----------------------------------------------------------------- the loop
    def _validate(self) -> tuple[float, float, float]:
        if self.rounds is not None:
            # In rounds the model of record is the global one, identical on every device.
            with self.rounds.global_weights():
                return self._validate_model()
        return self._validate_model()

    def _validate_model(self) -> tuple[float, float, float]:
        totals = tf.zeros([3], tf.float64)
        for images, labels in self.pipeline.validation_batches():
            totals += self._validation_step(images, labels)
        return tuple(self.exchange.sum_across_ranks(totals, "validation").numpy())  # type: ignore[return-value]

    def fit(self, observer: TrainingObserver) -> dict[str, Any]:
        """Train for the configured epochs; return the run summary (rank 0's view)."""
        settings = self.settings
        started = time.perf_counter()
        first_epoch = self._start()
        if self.rounds is not None:
            from globaldl.local_sgd.loop import fit_in_rounds

            return fit_in_rounds(self, observer, first_epoch, started)
        totals = RunTotals()
        history: list[dict[str, Any]] = []
        last = EpochResult(first_epoch, float("nan"), 0.0, float("nan"), 0.0, 0.0, 0.0)
        for epoch in range(first_epoch, settings.epochs):
            epoch_started = time.perf_counter()
            # The iterator's only reference: destroyed off this thread once the epoch is done.
            batches = [iter(self.pipeline.train_batches(epoch))]
            epoch_totals = np.zeros(3)
            progress = self.epoch_progress(epoch)
            for index in range(self.steps_per_epoch):
                self.run_step(batches[0], observer, totals, epoch_totals)
                progress.step_done(index + 1)
            release_in_background(batches)
            last = self.end_epoch(
                epoch, epoch_totals, self.steps_per_epoch, epoch_started, observer, totals
            )
            history.append(last.as_dict())
        return run_summary(self, last, totals, history, time.perf_counter() - started, first_epoch)

    def epoch_progress(self, epoch: int, first_step: int = 0) -> EpochProgress:
        """The progress line within `epoch` (rank 0; the other ranks print nothing)."""
        if self.rank != 0:
            return NoProgress()
        return EpochProgress(
            epoch, self.settings.epochs, self.steps_per_epoch, self.global_batch_size, first_step
        )

    def run_step(
        self,
        iterator: Any,
        observer: TrainingObserver,
        totals: RunTotals,
        epoch_totals: np.ndarray,
    ) -> bool:
        """Run one training step; add it to the run's and the epoch's totals.

        `epoch_totals` holds this rank's loss sum, correct predictions and examples over the
        epoch's finite steps. Returns whether every rank skipped the step (nonfinite gradients).
        """
        batch_size = self.batch_size
        started = time.perf_counter()
        totals.epoch_steps_started += 1
        # The cycle just ended is the previous step's; an epoch's first step is left out.
        if totals.last_step_started is not None and totals.epoch_steps_started >= 3:
            totals.step_wall_seconds += started - totals.last_step_started
            totals.step_wall_steps += 1
        totals.last_step_started = started
        cpu_before = time.process_time()
        values = self._train_step(iterator).numpy()
        if totals.steps > 0:  # the first step of the totals traces the graph
            totals.step_cpu_seconds += time.process_time() - cpu_before
            totals.step_cpu_steps += 1
        # The step moved each rank's moving statistics its own way (if the model has any).
        self._statistics_in_sync = not self.local_statistics
        phases = dict(zip(PHASES, values[: len(PHASES)].tolist(), strict=True))
        skipped = bool(values[SKIPPED])
        wire_bytes = int(values[WIRE_BYTES])
        raw_bytes = int(self.compressor.raw_bytes_per_step)
        if not skipped:
            epoch_totals += (values[LOSS] * batch_size, values[CORRECT], batch_size)
        observer.observe_step(
            phases, batch_size, raw_bytes, wire_bytes, float(values[LOSS]), skipped=skipped
        )
        if totals.steps == 0:
            totals.first_step_phase_seconds = dict(phases)
        totals.steps += 1
        totals.skipped_steps += int(skipped)
        totals.gradient_bytes_raw += raw_bytes
        totals.gradient_bytes_wire += wire_bytes
        for name, seconds in phases.items():
            totals.phase_seconds[name] += seconds
        return skipped

    def end_epoch(
        self,
        epoch: int,
        epoch_totals: np.ndarray,
        steps: int,
        epoch_started: float,
        observer: TrainingObserver,
        totals: RunTotals,
    ) -> EpochResult:
        """Average the epoch over all ranks, validate, checkpoint; return the epoch's result.

        `steps` is the number of steps this process ran in the epoch (all of them, or the
        part after an elastic restart), for the throughput.
        """
        totals.last_step_started = None  # the next epoch's first step starts afresh
        totals.epoch_steps_started = 0
        if self.rounds is not None:
            self.rounds.drain(observer, totals)  # validation sees every finished round
        train_seconds = time.perf_counter() - epoch_started
        train_sum = self.exchange.sum_across_ranks(tf.constant(epoch_totals), "train_totals")
        train_sum = train_sum.numpy()
        self.synchronise_local_statistics()
        # The checkpoint before the last round end: a resumed run continues mid-round.
        if self.settings.checkpoint_dir is not None:
            self._save(epoch + 1)
        if self.rounds is not None and epoch + 1 == self.settings.epochs:
            self.rounds.finish(observer, totals)
        val_loss_sum, val_correct, val_count = self._validate()
        result = EpochResult(
            epoch=epoch + 1,
            loss=float(train_sum[0] / max(train_sum[2], 1)),
            accuracy=float(train_sum[1] / max(train_sum[2], 1)),
            val_loss=float(val_loss_sum / max(val_count, 1)),
            val_accuracy=float(val_correct / max(val_count, 1)),
            seconds=time.perf_counter() - epoch_started,
            examples_per_second=(steps * self.global_batch_size / max(train_seconds, 1e-9)),
        )
        observer.observe_epoch(result.epoch, result.val_loss, result.val_accuracy)
        if self.rank == 0:
            self._print_progress(result, totals)
        return result

    def start_metrics(self, run_id: str) -> TrainingObserver:
        """Start the worker's Prometheus exporter (port: base + local rank), or a NullObserver."""
        settings = self.settings
        if settings.metrics_port is None:
            return NullObserver()
        return start_exporter(
            port=settings.metrics_port + self.exchange.local_rank,
            addr=settings.metrics_addr,
            rank=self.rank,
            device=self.device,
            run_id=run_id,
            certfile=str(settings.metrics_certfile) if settings.metrics_certfile else None,
            keyfile=str(settings.metrics_keyfile) if settings.metrics_keyfile else None,
            basic_auth=settings.metrics_basic_auth(),
        )

    def _print_progress(self, result: EpochResult, totals: RunTotals) -> None:
        step_total = sum(totals.phase_seconds.values()) or 1.0
        shares = " ".join(
            f"{name} {100 * seconds / step_total:.0f}%"
            for name, seconds in totals.phase_seconds.items()
        )
        print(
            f"epoch {result.epoch}/{self.settings.epochs}  loss {result.loss:.4f}  "
            f"acc {result.accuracy:.4f}  val_loss {result.val_loss:.4f}  "
            f"val_acc {result.val_accuracy:.4f}  {result.examples_per_second:.0f} examples/s  "
            f"{result.seconds:.1f}s  [{shares}]",
            flush=True,
        )


def run(settings: TrainSettings) -> dict[str, Any]:
    """Train with `settings`; rank 0 writes the summary. Returns the summary."""
    if settings.summary is not None:
        summary.check_writable(settings.summary)
    if settings.checkpoint_dir is not None:
        checkpoint.check_writable(settings.checkpoint_dir)
    trainer = Trainer(settings)
    if settings.run_id is None:
        # Every rank labels its metrics with the same run id: rank 0's start time.
        started = trainer.exchange.broadcast_value(
            tf.constant(int(time.time()), tf.int64), "run_id"
        )
        run_id = time.strftime("run-%Y%m%d-%H%M%S", time.gmtime(int(started)))
        trainer.settings = settings = settings.replace(run_id=run_id)
    observer = trainer.start_metrics(str(settings.run_id))
    try:
        result = trainer.fit(observer)
    finally:
        observer.close()
    if trainer.rank == 0 and settings.summary is not None:
        summary.write(settings.summary, result)
    return result
