"""Elastic training: the run goes on when devices leave, and takes in devices that join.

Launch it the way Horovod Elastic runs are launched (Gloo)::

    horovodrun -np 3 --min-np 2 --max-np 4 --host-discovery-script ./discover-hosts.sh
        --elastic-timeout 60 globaldl train --elastic --commit-every 20 ...

(one command line; `globaldl fleet run --elastic` builds it for the emulated fleet.)

What the run keeps, and where:

- Shared state, identical on every worker: the model weights, the optimizer's slots and
  iteration count, the compressor's shared state (weight-pruning masks, the shared scales of
  summed integer codes, shared top-k's score), the global step, the epoch, the position in the
  epoch (as the fraction of its steps done), the epoch history and the run id. After every
  membership change rank 0's committed copy is broadcast to all workers, so every worker,
  new or old, continues from the same step.
- Local state, each worker's own and never broadcast: the compression residuals (error
  feedback) and DGC's momentum, and the epoch's running train totals.

Every `commit_every` steps, and at the end of each epoch, the state is committed (copied to
host memory) and the worker asks the launcher whether hosts were added or removed. A device
that dies makes the step's collective fail on every survivor: each rolls back to its last
commit (so at most `commit_every` steps are lost), Horovod forms a new ring from the live
workers, and training continues. A device that joins is noticed at the next commit: every
worker stops at that same step, the ring re-forms with the new worker, and it receives the
shared state before its first step.

The new size changes what depends on it: each worker's shard of the data (its rank and the
number of ranks), the learning rate (scaled by the number of workers, as at start), the global
batch (local batch x workers) and the steps per epoch. The position in the epoch is kept as a
fraction, so after a change every worker starts its new shard that far in.

Residual policy on a membership change. An error-feedback residual is what a worker computed
and has not sent yet, in the units of its own local gradient (averaging happens after the
exchange), so it does not depend on the number of workers. Survivors roll their residuals
back to the commit together with the weights: the steps after the commit are re-run, and
keeping their residuals would send those gradients twice. A departed worker's residual is
lost: the unsent part of its own recent gradients (mostly the small entries top-k left
behind), a bounded perturbation of the kind error feedback already tolerates. A new worker
starts with a zero residual: it has sent nothing, so it owes nothing. Residuals are never
moved between workers: one worker's residual given to another would be sent twice.

Known failure modes of Horovod Elastic, and what guards against each:

- Survivors below `--min-np`: the launcher waits `--elastic-timeout` seconds (Horovod's default
  is 600) for enough hosts, then stops every worker with an error. Set it; `globaldl fleet run
  --elastic` passes 60 s.
- A new worker hanging in its first broadcast: a worker must not run a collective before the
  elastic loop's first synchronisation. Building a `Trainer` runs none, and the run id travels
  in the synchronised state.
- A joining worker that starts slower than the Gloo timeout: the re-formed ring's rendezvous
  gives up waiting for it and every worker aborts (measured on the fleet: at 10 s a revived
  0.5-core device, which needs ~20 s to import TensorFlow, took the whole run down). The same
  Horovod timeout is how long survivors wait for a device that vanished silently. Two timeouts
  (globaldl/elastic_timeouts.py, with the third edit of scripts/build-horovod.sh): every ring
  forms under the long join timeout (GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS, 60 s) and trains
  under the short collective timeout (GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS, 10 s) from its
  first step; a ring whose steps are too slow for it re-forms once under 4x its slowest step.
- State restored at different steps on different ranks: after a failure each survivor rolls
  back to its own last commit, which can differ if the failure struck during a commit; the
  synchronisation that follows overwrites every worker's shared state with rank 0's, so all
  continue from rank 0's step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from globaldl import summary
from globaldl.elastic_timeouts import (
    STEPS_BEFORE_TIMEOUT_CHECK,
    GlooTimeouts,
    horovod_splits_the_timeouts,
    use_gloo_timeouts,
)
from globaldl.monitoring import NullObserver, TrainingObserver
from globaldl.optimizers import optimizer_variables
from globaldl.pipelines.release import release_in_background
from globaldl.run_record import EpochResult, RunTotals, run_summary
from globaldl.settings import TrainSettings
from globaldl.trainer import Trainer

log = logging.getLogger(__name__)

RESIDUAL_POLICY = (
    "survivors roll residuals back to their own last commit; a departed worker's residual is "
    "dropped; a new worker starts from zero; residuals never move between workers"
)


def _is_horovod_failure(error: BaseException) -> bool:
    """Whether a TensorFlow error is a collective failing because the ring broke."""
    return isinstance(error, tf.errors.OpError) and "horovod" in str(error).lower()


def _collective_failures_as_horovod_errors(call: Callable[[], Any]) -> Any:
    """Run `call`; re-raise a broken-ring TensorFlow error as Horovod's HorovodInternalError.

    Horovod's own TensorFlow wrapper recognises only three op names in the error text; the
    step's collectives run inside a `tf.function`, where the text differs.
    """
    from horovod.common.exceptions import HorovodInternalError

    try:
        return call()
    except tf.errors.OpError as error:
        if _is_horovod_failure(error):
            raise HorovodInternalError(error) from error
        raise


@dataclass
class ElasticEvent:
    """One membership change, as this worker saw it."""

    reason: str  # "failure" (a collective broke) or "hosts_changed" (discovery changed)
    detected_at: float  # unix time
    size_before: int
    size_after: int = 0
    lost_steps: int = 0
    step: int = 0
    first_step_at: float | None = None


def _state_base() -> type:
    from horovod.common.elastic import State

    return State


class ElasticState(_state_base()):  # type: ignore[misc]
    """The training state Horovod Elastic commits, restores and synchronises.

    Holds the current `Trainer`; after a membership change it builds a new one for the new
    size and moves the committed state into it.
    """

    def __init__(self, settings: TrainSettings, phase_timing: bool = True) -> None:
        self.settings = settings
        self.phase_timing = phase_timing
        # Rings form under the long join timeout and train under the short collective one.
        self.timeouts = GlooTimeouts.from_env()
        self.gloo_timeout_seconds = self.timeouts.collective_seconds
        if not horovod_splits_the_timeouts():
            log.warning(
                "elastic: this Horovod lacks the rendezvous join-timeout edit of "
                "scripts/build-horovod.sh; collectives wait the join timeout (%d s) too",
                self.timeouts.join_seconds,
            )
            self.gloo_timeout_seconds = self.timeouts.join_seconds
        use_gloo_timeouts(self.gloo_timeout_seconds, self.timeouts.join_seconds)
        self._new_ring()
        self.timeout_changes: list[dict[str, Any]] = []
        self._timeout_changed_last = False
        self.trainer = Trainer(settings, phase_timing=phase_timing)
        exchange = self.trainer.exchange
        # Shared Python state (rank 0's wins at every sync).
        self.epoch = 0
        self.fraction = 0.0
        self.history: list[dict[str, Any]] = []
        self.run_id = settings.run_id or time.strftime("run-%Y%m%d-%H%M%S", time.gmtime())
        # Local Python state.
        self.epoch_totals = np.zeros(3)
        self.sizes = [self.trainer.size]
        self.events: list[ElasticEvent] = []
        self.lost_steps = 0
        self._committed: dict[str, Any] = {}
        super().__init__(
            bcast_object=lambda value: exchange.broadcast_object(value, "elastic_state"),
            get_rank=lambda: self.trainer.exchange.rank,
        )
        self.save()

    # -------------------------------------------------------------- what is state
    def _shared_variables(self, trainer: Trainer) -> list[tf.Variable]:
        # In rounds the inner optimizer is each device's own; the weights are shared because
        # commits happen only at sync points, where every device holds the global weights.
        inner = optimizer_variables(trainer.optimizer) if trainer.rounds is None else []
        rounds = trainer.rounds.shared_variables() if trainer.rounds is not None else []
        return [
            *trainer.model.variables,
            *inner,
            *trainer.compressor.shared_state_variables,
            trainer.step,
            trainer.epoch,
            *rounds,
        ]

    def _local_variables(self, trainer: Trainer) -> list[tf.Variable]:
        inner = optimizer_variables(trainer.optimizer) if trainer.rounds is not None else []
        return [*trainer.compressor.local_state_variables, *inner]

    def _shared_objects(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "fraction": self.fraction,
            "history": list(self.history),  # a copy: a commit must not change afterwards
            "run_id": self.run_id,
        }

    def _take_shared_objects(self, objects: dict[str, Any]) -> None:
        self.epoch, self.fraction = objects["epoch"], objects["fraction"]
        self.history, self.run_id = list(objects["history"]), objects["run_id"]

    # -------------------------------------------------------------- Horovod's State API
    def commit(self) -> None:
        """Average the moving statistics, commit (save, check for new hosts), check the timeout.

        After the average every worker commits the same shared state, so whichever worker
        ends up rank 0 after a failure, the state broadcast from it is the fleet's.
        """
        self.trainer.synchronise_local_statistics()
        super().commit()
        self._loosen_if_needed()

    # -------------------------------------------------------------- the collective timeout
    def _new_ring(self) -> None:
        """A ring just formed: time its steps afresh, check its collective timeout again."""
        self._timeout_checked = False
        self._steps_timed = 0
        self._slowest_step_seconds = 0.0
        self._loosen_to: int | None = None

    def _loosen_if_needed(self) -> None:
        """Once per ring, after a few timed steps: re-form it if its steps need a longer timeout.

        Rank 0 decides from its slowest step and broadcasts the decision, so every worker
        raises the interrupt at this same committed step (or none does). The state was just
        committed on every worker; the synchronisation still runs (one broadcast of the shared
        state), in case a device joined while the ring re-formed.
        """
        if self._timeout_checked or self._steps_timed < STEPS_BEFORE_TIMEOUT_CHECK:
            return
        from horovod.common.exceptions import HostsUpdatedInterrupt

        self._timeout_checked = True
        proposal = self.timeouts.safe_collective_seconds(self._slowest_step_seconds)
        exchange = self.trainer.exchange
        seconds = _collective_failures_as_horovod_errors(
            lambda: exchange.broadcast_object(proposal, "elastic_gloo_timeout")
        )
        if seconds <= self.gloo_timeout_seconds:
            return
        self._loosen_to = int(seconds)
        raise HostsUpdatedInterrupt(False)

    def restart_ring(self) -> None:
        """Leave the ring and form the next one: join timeout to form, collective timeout to train.

        A loosening re-forms the same members under the longer collective timeout it chose.
        """
        if self._loosen_to is not None:
            self.gloo_timeout_seconds = self._loosen_to
        use_gloo_timeouts(self.gloo_timeout_seconds, self.timeouts.join_seconds)
        self.trainer.exchange.restart()

    def save(self) -> None:
        """Commit: copy the shared and local state to host memory."""
        self._committed = {
            "shared": [v.numpy() for v in self._shared_variables(self.trainer)],
            "local": [v.numpy() for v in self._local_variables(self.trainer)],
            "objects": self._shared_objects(),
            "epoch_totals": self.epoch_totals.copy(),
            "step": int(self.trainer.step.numpy()),
        }

    @property
    def committed_step(self) -> int:
        """The global step of the last commit."""
        return int(self._committed["step"])

    def restore(self) -> None:
        """A collective failed: undo everything since the last commit."""
        lost = int(self.trainer.step.numpy()) - self._committed["step"]
        self.lost_steps += max(0, lost)
        self.events.append(
            ElasticEvent("failure", time.time(), self.trainer.size, lost_steps=max(0, lost))
        )
        self._load(self.trainer)

    def _load(self, trainer: Trainer) -> None:
        committed = self._committed
        for variable, value in zip(
            self._shared_variables(trainer), committed["shared"], strict=True
        ):
            variable.assign(value)
        for variable, value in zip(self._local_variables(trainer), committed["local"], strict=True):
            variable.assign(value)
        self._take_shared_objects(committed["objects"])
        self.epoch_totals = committed["epoch_totals"].copy()
        if trainer.rounds is not None:
            trainer.rounds.after_restore(committed["step"], own_state_found=True)

    def check_host_updates(self) -> None:
        """Ask the launcher whether hosts changed; raises HostsUpdatedInterrupt if they did."""
        from horovod.common.exceptions import HostsUpdatedInterrupt

        try:
            _collective_failures_as_horovod_errors(super().check_host_updates)
        except HostsUpdatedInterrupt:
            self.events.append(ElasticEvent("hosts_changed", time.time(), self.trainer.size))
            raise

    def reset(self) -> None:
        """The ring re-formed: rebuild the trainer for the new size and move the state in.

        A loosening that found the same members keeps the trainer (and its traced step).
        """
        old = self.trainer
        exchange = old.exchange
        if self._loosen_to is not None:
            loosened, self._loosen_to = self._loosen_to, None
            if (exchange.size, exchange.rank) == (old.size, old.rank):
                self.timeout_changes.append(
                    {"at": time.time(), "step": int(old.step.numpy()), "seconds": loosened}
                )
                self._timeout_changed_last = True
                log.warning("elastic: collective timeout now %d s", loosened)
                return
            # The members changed while re-forming: a membership change after all.
            self.events.append(ElasticEvent("hosts_changed", time.time(), old.size))
        self._timeout_changed_last = False
        self._new_ring()
        self.trainer = Trainer(self.settings, exchange=old.exchange, phase_timing=self.phase_timing)
        if old.rounds is not None and self.trainer.rounds is not None:
            self.trainer.rounds.totals = old.rounds.totals  # the run's rounds, not the ring's
        self._load(self.trainer)
        self.sizes.append(self.trainer.size)
        if self.events:
            self.events[-1].size_after = self.trainer.size
            self.events[-1].step = int(self.trainer.step.numpy())
        log.warning(
            "elastic: %d workers now (was %d); this worker is rank %d",
            self.trainer.size,
            old.size,
            self.trainer.rank,
        )

    def sync(self) -> None:
        """Every worker takes rank 0's shared state; then commits it."""
        trainer = self.trainer

        def broadcast() -> dict[str, Any]:
            trainer.exchange.broadcast_variables(self._shared_variables(trainer), root_rank=0)
            return trainer.exchange.broadcast_object(self._shared_objects(), "elastic_objects")

        self._take_shared_objects(_collective_failures_as_horovod_errors(broadcast))
        if trainer.rounds is not None:
            trainer.rounds.after_restore(int(trainer.step.numpy()), own_state_found=True)
        if self.events and not self._timeout_changed_last:
            self.events[-1].step = int(trainer.step.numpy())
        self.save()

    # -------------------------------------------------------------- reporting
    def note_step_done(self, seconds: float | None = None) -> None:
        """Record when the first step after a membership change completed, and how long steps take.

        `seconds` is the step's wall time; None for a step that does not count (the first on a
        ring traces the step function).
        """
        if self.events and self.events[-1].first_step_at is None:
            self.events[-1].first_step_at = time.time()
        if seconds is not None:
            self._steps_timed += 1
            self._slowest_step_seconds = max(self._slowest_step_seconds, seconds)

    def elastic_summary(self) -> dict[str, Any]:
        """The summary's `elastic` section: sizes, resets, lost steps, events."""
        return {
            "commit_every": self.settings.commit_every,
            "resets": len(self.sizes) - 1,
            "lost_steps": self.lost_steps,
            "sizes": list(self.sizes),
            "residual_policy": RESIDUAL_POLICY,
            "events": [dict(event.__dict__) for event in self.events],
            "gloo_join_timeout_seconds": self.timeouts.join_seconds,
            "gloo_collective_timeout_seconds": self.gloo_timeout_seconds,
            "collective_timeout_changes": list(self.timeout_changes),
        }


class _ElasticLoop:
    """The training loop Horovod Elastic re-enters after every membership change."""

    def __init__(self, settings: TrainSettings) -> None:
        self.settings = settings
        self.observer: TrainingObserver = NullObserver()
        self.totals = RunTotals()
        self.started = time.perf_counter()

    def _start_exporter(self, state: ElasticState) -> None:
        """Serve metrics once the run id is known (labels use the rank at that time)."""
        if isinstance(self.observer, NullObserver):
            self.observer = state.trainer.start_metrics(str(state.run_id))

    def __call__(self, state: ElasticState) -> dict[str, Any]:
        try:
            return _collective_failures_as_horovod_errors(lambda: self._train(state))
        except BaseException:
            # The ring restarts next: no round exchange may still be running in it.
            if state.trainer.rounds is not None:
                state.trainer.rounds.abandon()
            raise

    def _commit_due(self, trainer: Trainer, step: int, committed_step: int) -> bool:
        """Whether to commit after this step.

        Per step: every `commit_every` steps. In rounds: at the first round end after that
        many steps since the last commit, with the round in flight applied first (overlap).
        """
        rounds = trainer.rounds
        if rounds is None:
            return step % self.settings.commit_every == 0
        if not rounds.after_step(self.observer, self.totals):
            return False
        if step - committed_step < self.settings.commit_every:
            return False
        rounds.drain(self.observer, self.totals)
        return True

    def _train(self, state: ElasticState) -> dict[str, Any]:
        self._start_exporter(state)
        settings = self.settings
        trainer = state.trainer
        steps_per_epoch = trainer.steps_per_epoch
        last = EpochResult(state.epoch, float("nan"), 0.0, float("nan"), 0.0, 0.0, 0.0)
        first_step_of_entry = True
        while state.epoch < settings.epochs:
            first = min(steps_per_epoch, round(state.fraction * steps_per_epoch))
            epoch_started = time.perf_counter()
            # The iterator's only reference: destroyed off this thread once the epoch is done.
            batches = [iter(trainer.pipeline.train_batches(state.epoch, first))]
            # Every step advances the global step by one (skipped steps too): count it here
            # rather than read the variable back after every step.
            step = int(trainer.step.numpy())
            progress = trainer.epoch_progress(state.epoch, first)
            for index in range(first, steps_per_epoch):
                step_started = time.perf_counter()
                trainer.run_step(batches[0], self.observer, self.totals, state.epoch_totals)
                progress.step_done(index + 1)
                step += 1
                # The first step after (re-)entering traces the step function: not timed.
                timed = not first_step_of_entry
                first_step_of_entry = False
                state.note_step_done(time.perf_counter() - step_started if timed else None)
                state.fraction = (index + 1) / steps_per_epoch
                if self._commit_due(trainer, step, state.committed_step):
                    state.commit()
            release_in_background(batches)
            last = trainer.end_epoch(
                state.epoch,
                state.epoch_totals,
                steps_per_epoch - first,
                epoch_started,
                self.observer,
                self.totals,
            )
            state.history.append(last.as_dict())
            state.epoch, state.fraction = state.epoch + 1, 0.0
            state.epoch_totals = np.zeros(3)
            if trainer.rounds is None or trainer.rounds.at_sync_point:
                state.commit()
        if state.history:
            last = EpochResult(**state.history[-1])
        trainer.settings = settings.replace(run_id=state.run_id)
        result = run_summary(
            trainer, last, self.totals, state.history, time.perf_counter() - self.started, 0
        )
        result["elastic"] = state.elastic_summary()
        return result


def run_elastic(settings: TrainSettings) -> dict[str, Any]:
    """Train under Horovod Elastic; the worker that ends as rank 0 writes the summary."""
    from horovod.common.elastic import run_fn

    if settings.summary is not None:
        summary.check_writable(settings.summary)
    state = ElasticState(settings)
    loop = _ElasticLoop(settings)
    try:
        result = run_fn(loop, state.restart_ring)(state)
    finally:
        loop.observer.close()
    if state.trainer.rank == 0 and settings.summary is not None:
        summary.write(settings.summary, result)
    return result
