"""Shared-seed random-k: every rank draws the same k entries, so the payloads can be summed."""

from __future__ import annotations

from globaldl.compression.randomk import RandomK
from globaldl.compression.sparsifier import SPARSIFIERS


@SPARSIFIERS.register
class SharedRandomK(RandomK):
    """Random-k with a seed that leaves the rank out: all ranks keep the same positions.

    The positions depend only on the configured seed and the step, so no index travels and
    the values go through one allreduce (Stich et al. 2018 analyse random-k with error
    feedback; Vogels et al. 2019 use this shared-seed form as an all-reduce baseline).
    """

    name = "shared-randomk"
    agreed_indices = True
