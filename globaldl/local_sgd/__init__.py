"""Fewer rounds: local steps between exchanges of compressed model deltas (local SGD, DiLoCo).

- `schedule`: `--sync-every` (steps or a wall-clock budget) and the settings rounds refuse;
  no TensorFlow, the settings use it.
- `outer`: the outer optimizers (`sgd`, `nesterov`) that apply the averaged round delta.
- `round_graph`: the global weights and the round's TensorFlow functions.
- `engine`: when a round ends, what is in flight, what it cost (`RoundEngine`).
- `overlap`: the background exchange thread and the ledger that keeps rounds in order.
- `local_step`: the training step without an exchange; `loop`: epochs in rounds;
  `report`: the run summary's `rounds` section.
"""
