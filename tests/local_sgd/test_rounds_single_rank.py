"""Rounds on one rank, in this process (Horovod of size 1, real collectives of one).

With one device and lossless exchange, outer SGD at learning rate 1 moves the global weights
exactly to the device's weights at every round end, so a run in rounds must follow plain
training step for step: a round applied twice, skipped, or left on the weights beside its
average would move the weights by a whole round's progress.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from globaldl.monitoring import NullObserver
from globaldl.settings import TrainSettings

STEPS, ROUND_STEPS, SEED = 24, 4, 3
# One round's progress of LeNet at these settings is ~1e-2 (checked below); float rounding of
# the round ends stays near 1e-7.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def exchange() -> Any:
    from globaldl.exchange import Exchange

    return Exchange()


def _train(exchange: Any, **changes: Any) -> tuple[Any, list[np.ndarray], dict[str, Any]]:
    from globaldl.compression import CompressionConfig
    from globaldl.trainer import Trainer

    settings = TrainSettings(
        epochs=1,
        max_steps_per_epoch=STEPS,
        seed=SEED,
        compression=CompressionConfig(seed=SEED),
        **changes,
    )
    trainer = Trainer(settings, exchange)
    initial = [variable.numpy() for variable in trainer.model.variables]
    summary = trainer.fit(NullObserver())
    weights = [variable.numpy() for variable in trainer.model.variables]
    return trainer, [w - w0 for w, w0 in zip(weights, initial, strict=True)], summary


@pytest.fixture(scope="module")
def plain(exchange: Any) -> tuple[Any, list[np.ndarray], dict[str, Any]]:
    return _train(exchange)


def test_sync_every_one_is_todays_per_step_training_bit_for_bit(
    exchange: Any, plain: tuple[Any, list[np.ndarray], dict[str, Any]]
) -> None:
    today, today_moved, today_summary = plain
    trainer, moved, summary = _train(exchange, sync_every="1")
    assert today.rounds is None and trainer.rounds is None  # no round machinery at all
    for ours, theirs in zip(moved, today_moved, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert summary["weight_digests"] == today_summary["weight_digests"]
    assert summary["rounds"]["rounds"] == summary["steps"] == STEPS


@pytest.mark.parametrize("overlap", [False, True], ids=["in-place", "overlapped"])
def test_rounds_of_one_device_follow_plain_training_each_round_applied_once(
    exchange: Any, plain: tuple[Any, list[np.ndarray], dict[str, Any]], overlap: bool
) -> None:
    _, plain_moved, _ = plain
    trainer, moved, summary = _train(exchange, sync_every=str(ROUND_STEPS), overlap=overlap)
    rounds = summary["rounds"]
    assert rounds["rounds"] == STEPS // ROUND_STEPS and rounds["rounds_applied_in_order"]
    assert trainer.rounds.ledger.applied == list(range(STEPS // ROUND_STEPS))
    per_round_progress = max(np.abs(w).max() for w in plain_moved) / (STEPS // ROUND_STEPS)
    assert per_round_progress > 100 * TOLERANCE
    for ours, theirs in zip(moved, plain_moved, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOLERANCE)
    assert summary["weights_identical"]


def test_a_nan_delta_skips_the_round_and_the_device_restarts_clean(exchange: Any) -> None:
    trainer, moved, summary = _train(exchange, sync_every=str(ROUND_STEPS), inject_nan_step=5)
    assert summary["rounds"]["skipped_rounds"] == 1
    # Step 5's gradient is NaN: steps 6 and 7 run on non-finite weights, and a non-finite
    # loss is left out of the epoch's loss; after the round nothing non-finite remains.
    # Whether those losses are non-finite depends on the CPU's kernels: on an Intel Xeon
    # TensorFlow's max-pool returns 3.0 for the window [NaN, 1, 2, 3] (checked), so the
    # losses stay finite there and no step is skipped; on an AMD EPYC both were.
    assert summary["skipped_steps"] in (0, 2)
    assert all(np.isfinite(w).all() for w in moved)
    assert all(np.isfinite(v.numpy()).all() for v in trainer.optimizer.variables())
    assert np.isfinite(summary["history"][-1]["loss"])


@pytest.mark.parametrize(
    ("prune", "quantize", "overlap"),
    [("powersgd", "none", True), ("shared-topk", "intsum", False)],
    ids=["powersgd-two-collectives-overlapped", "shared-topk-intsum-in-place"],
)
def test_rounds_run_summed_codecs_through_the_site_hierarchy_and_keep_their_shared_state(
    exchange: Any, tmp_path: Any, prune: str, quantize: str, overlap: bool
) -> None:
    """Each round end obeys the codec's WireSpec (PowerSGD: two summed collectives, the second
    computed from the first's sum) and applies the shared state its exchange decided; with
    `--hierarchy sites` the sums go through the site path (one site of one device here: the
    4-rank site sums are proved in tests/integration/test_summed_exchange.py)."""
    import socket

    from globaldl.compression import CompressionConfig

    site_map = tmp_path / "sites.yaml"
    site_map.write_text(f"sites:\n  here: [{socket.gethostname()}]\n")
    compression = CompressionConfig(prune=prune, quantize=quantize, density=0.05, seed=SEED)
    try:
        from globaldl.trainer import Trainer

        settings = TrainSettings(
            epochs=1,
            max_steps_per_epoch=STEPS,
            seed=SEED,
            sync_every=str(ROUND_STEPS),
            overlap=overlap,
            compression=compression,
            hierarchy="sites",
            sites_file=site_map,
        )
        trainer = Trainer(settings, exchange)
        shared_before = [v.numpy().copy() for v in trainer.compressor.shared_state_variables]
        assert shared_before, "these codecs keep shared state"
        summary = trainer.fit(NullObserver())
    finally:
        exchange.hierarchy = None  # the module's other runs use the flat exchange
    rounds = summary["rounds"]["rounds"]
    assert rounds == STEPS // ROUND_STEPS and summary["rounds"]["rounds_applied_in_order"]
    spec = trainer.wire_spec
    assert spec.rounds == (2 if prune == "powersgd" else 1)
    assert not trainer.rounds.graph.counts_travel  # LeNet: no statistics, rounds by steps
    assert summary["gradient_bytes_wire"] == rounds * sum(spec.round_bytes)
    assert summary["exchange"]["hierarchy"] == "sites"
    assert summary["exchange"]["collectives_per_round"] == spec.rounds
    shared_after = trainer.compressor.shared_state_variables
    for before, variable in zip(shared_before, shared_after, strict=True):
        assert not np.array_equal(before, variable.numpy()), variable.name
    assert all(np.isfinite(v.numpy()).all() for v in trainer.model.variables)
    assert summary["weights_identical"]
