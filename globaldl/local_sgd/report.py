"""The run summary's `rounds` section: rounds, bytes per training sample, compute utilisation.

Filled for every run, per-step ones included (a round is then one step), so runs with and
without local steps compare field by field. Definitions (rank 0's view):

- `wire_bytes_per_sample`: bytes this device handed to the gradient or delta collectives,
  over the examples it trained on.
- `dense_fp32_bytes_per_sample`: the same for dense fp32 gradients exchanged every step (all
  gradients, 4 bytes each, per step, over the local batch); `bytes_per_sample_reduction` is
  their ratio. Payload bytes, not interface bytes: the fleet's byte accounting has those.
- `compute_utilisation`: the share of the timed training loop spent in local work (loading
  data, forward and backward, the inner optimizer step); the rest is the loop's time at
  exchanges (compress, exchange or waiting for it, decompress, the outer step). Validation and
  checkpoints are outside the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from globaldl.local_sgd.schedule import SyncInterval

PER_STEP_SYNC_PHASES = ("compress", "exchange", "decompress")


def rounds_summary(
    *,
    sync_every: SyncInterval,
    phase_seconds: Mapping[str, float],
    steps: int,
    skipped_steps: int,
    examples: int,
    gradient_bytes_wire: int,
    raw_bytes_per_step: int,
    batch_size: int,
    engine_fields: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The `rounds` section; `engine_fields` is `RoundEngine.summary()` (None: per step)."""
    loop_seconds = sum(phase_seconds.values())
    if engine_fields is None:
        sync_seconds = sum(phase_seconds[name] for name in PER_STEP_SYNC_PHASES)
        fields: dict[str, Any] = {
            "overlap": False,
            "outer_optimizer": None,
            "inner_optimizer_state": "none: every step applies the exchanged gradients",
            "rounds": steps,
            "skipped_rounds": skipped_steps,
            "rounds_applied_in_order": True,
            "sync_seconds": sync_seconds,
            "first_round_sync_seconds": None,  # the first step's phases hold it
            "background_exchange_seconds": 0.0,
        }
    else:
        fields = dict(engine_fields)
        sync_seconds = float(fields["sync_seconds"])
    wire_per_sample = gradient_bytes_wire / examples if examples > 0 else None
    dense_per_sample = raw_bytes_per_step / batch_size
    return {
        "sync_every": str(sync_every),
        **fields,
        "local_steps": steps,
        "examples": examples,
        "local_seconds": max(0.0, loop_seconds - sync_seconds),
        "compute_utilisation": (
            max(0.0, loop_seconds - sync_seconds) / loop_seconds if loop_seconds > 0 else None
        ),
        "wire_bytes_per_sample": wire_per_sample,
        "dense_fp32_bytes_per_sample": dense_per_sample,
        "bytes_per_sample_reduction": (
            dense_per_sample / wire_per_sample if wire_per_sample else None
        ),
    }
