import math

import pytest

from globaldl.monitoring import PHASES, bottleneck_phase, phase_shares
from globaldl.monitoring.phases import own_seconds_per_step


def test_phases_are_the_step_in_data_flow_order():
    assert PHASES == ("data_load", "compute", "compress", "exchange", "decompress", "apply")


@pytest.mark.parametrize("slow_phase", PHASES)
def test_bottleneck_is_the_phase_with_the_largest_share(slow_phase):
    seconds = {phase: 0.01 for phase in PHASES}
    seconds[slow_phase] = 0.011
    assert bottleneck_phase(seconds) == slow_phase


def test_bottleneck_counts_missing_phases_as_zero():
    assert bottleneck_phase({"exchange": 0.2, "compute": 0.1}) == "exchange"


def test_bottleneck_tie_goes_to_the_earlier_phase_of_the_step():
    assert bottleneck_phase({"apply": 0.5, "compute": 0.5}) == "compute"


def test_shares_sum_to_one_and_keep_proportions():
    shares = phase_shares({"data_load": 3.0, "compute": 1.0})
    assert math.isclose(sum(shares.values()), 1.0)
    assert shares["data_load"] == pytest.approx(0.75)
    assert shares["exchange"] == 0.0


@pytest.mark.parametrize(
    ("phase_seconds", "message"),
    [
        ({"forward": 1.0}, "unknown phase 'forward'; allowed phases: data_load, compute"),
        ({"compute": -0.1}, "phase 'compute' took -0.1 seconds"),
        ({"compute": float("nan")}, "phase 'compute' took nan seconds"),
        ({"compute": 0.0}, "phase seconds sum to 0"),
    ],
)
def test_bad_phase_seconds_raise_value_error_naming_the_value(phase_seconds, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        bottleneck_phase(phase_seconds)


def test_own_seconds_cut_every_exchange_to_the_least_one_of_the_run():
    own = own_seconds_per_step(
        {
            ("edge-a", 0): {"data_load": 0.01, "exchange": 0.30},  # waited for rank 1
            ("edge-a", 1): {"data_load": 0.30, "exchange": 0.02},  # the straggler
            ("edge-b", 2): {"compute": 0.05, "exchange": 0.29},
        }
    )
    assert {key: seconds["exchange"] for key, seconds in own.items()} == {
        ("edge-a", 0): 0.02,
        ("edge-a", 1): 0.02,
        ("edge-b", 2): 0.02,
    }
    assert own[("edge-a", 1)]["data_load"] == 0.30 and own[("edge-b", 2)]["compute"] == 0.05
    assert bottleneck_phase(own[("edge-b", 2)]) == "compute"
    assert own_seconds_per_step({}) == {}
