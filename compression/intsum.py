"""Integer-sum quantizer: codes on a scale every rank shares, summed exactly by allreduce."""

from __future__ import annotations

from globaldl.compression.base import check_range, check_type
from globaldl.compression.lanes import MAX_LANE_BITS, MIN_LANE_BITS, max_ranks
from globaldl.compression.quantizer import QUANTIZERS, Quantizer
from globaldl.compression.summable import LaneSum


@QUANTIZERS.register
class IntSum(Quantizer):
    """``lane_bits`` bits per value on the wire whatever the number of ranks (LaneSum).

    Each rank's value becomes an integer code in [-L, L] on its tensor's shared scale, with
    L = floor((2**lane_bits - 1) / (2 N)); the allreduce adds the codes of all N ranks in
    lanes that cannot overflow, and every rank decodes the one sum. With 8 bits: 63 levels
    each side at 2 ranks, 7 at 16, 1 at 127 (the largest N), and one byte per value always.
    Deterministic rounding, so it is biased on its own; error feedback (the default) sends
    what rounding and clipping left out in later steps. Payloads can only be summed: every
    rank must send the same positions (prune none, shared-randomk, shared-topk).
    """

    name = "intsum"
    gatherable = False

    def __init__(self, lane_bits: int = 8) -> None:  # noqa: D107
        check_type("lane_bits", lane_bits, int)
        check_range("lane_bits", lane_bits, MIN_LANE_BITS, MAX_LANE_BITS)
        self.lane_bits = lane_bits

    @property
    def bits_per_value(self) -> int:  # type: ignore[override]
        """The lane width (the word packing may add a fraction of a bit; see LaneSum)."""
        return self.lane_bits

    @property
    def max_ranks(self) -> int:
        """The most ranks whose codes these lanes can sum (L >= 1)."""
        return max_ranks(self.lane_bits)

    def get_config(self):  # noqa: D102
        return {"lane_bits": self.lane_bits}

    @classmethod
    def from_compression_config(cls, config):  # noqa: D102
        return cls(lane_bits=config.sum_bits)

    def sum_encoding(self, num_ranks, value_groups, num_groups):  # noqa: D102
        return LaneSum(self.lane_bits, num_ranks, value_groups, num_groups)
