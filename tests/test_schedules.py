"""The learning-rate schedule: a linear warm-up to the peak, then held or cosine-decayed to 0."""

from __future__ import annotations

import math

import pytest
import tensorflow as tf
import tf_keras as keras

from globaldl.schedules import WarmupThenDecay, learning_rate


def _rates(schedule: WarmupThenDecay, steps: range) -> list[float]:
    return [float(schedule(step)) for step in steps]


def test_warmup_climbs_linearly_to_the_peak_then_cosine_decays_to_zero_at_the_last_step() -> None:
    schedule = WarmupThenDecay(0.04, warmup_steps=4, total_steps=12, decay="cosine")
    rates = _rates(schedule, range(13))
    assert rates[:4] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert rates[4] == pytest.approx(0.04)
    assert rates[8] == pytest.approx(0.02)  # halfway through the decay
    assert rates[12] == pytest.approx(0.0, abs=1e-9)
    assert all(later <= earlier for earlier, later in zip(rates[4:], rates[5:], strict=False))


def test_without_decay_the_rate_stays_at_the_peak_after_the_warmup() -> None:
    schedule = WarmupThenDecay(0.1, warmup_steps=2, total_steps=10, decay="none")
    assert _rates(schedule, range(0, 10)) == pytest.approx([0.05] + [0.1] * 9)


def test_cosine_without_warmup_starts_at_the_peak() -> None:
    schedule = WarmupThenDecay(1.0, warmup_steps=0, total_steps=4, decay="cosine")
    expected = [0.5 * (1 + math.cos(math.pi * step / 4)) for step in range(5)]
    assert _rates(schedule, range(5)) == pytest.approx(expected, abs=1e-6)


def test_a_plain_rate_is_returned_when_nothing_changes_it() -> None:
    assert learning_rate(0.02, warmup_epochs=0, decay="none", steps_per_epoch=5, epochs=3) == 0.02
    scheduled = learning_rate(0.02, warmup_epochs=1, decay="cosine", steps_per_epoch=5, epochs=3)
    assert isinstance(scheduled, WarmupThenDecay)
    assert (scheduled.warmup_steps, scheduled.total_steps) == (5, 15)


def test_config_round_trips_and_the_optimizer_reads_the_schedule_at_its_iteration() -> None:
    schedule = WarmupThenDecay(0.04, warmup_steps=10, total_steps=100, decay="cosine")
    assert WarmupThenDecay(**schedule.get_config()).get_config() == schedule.get_config()
    weight = tf.Variable([1.0])
    optimizer = keras.optimizers.SGD(learning_rate=schedule)
    optimizer.build([weight])
    optimizer.iterations.assign(4)
    optimizer.apply_gradients([(tf.constant([1.0]), weight)])  # step 4 of the warm-up: 0.02
    assert float(optimizer.learning_rate) == pytest.approx(0.02)
    assert float(weight[0]) == pytest.approx(1.0 - 0.02)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"peak": 0.0}, "peak learning rate 0.0 is not allowed"),
        ({"warmup_steps": -1}, "warmup_steps -1 is not allowed"),
        ({"total_steps": 0}, "total_steps 0 is not allowed"),
        ({"decay": "step"}, "decay 'step' is not one of: none, cosine"),
    ],
)
def test_bad_arguments_are_named(arguments: dict, message: str) -> None:
    values = {"peak": 0.1, "warmup_steps": 1, "total_steps": 10, "decay": "none", **arguments}
    with pytest.raises(ValueError, match=message):
        WarmupThenDecay(**values)
