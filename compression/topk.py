"""Top-k sparsifier: send the k entries of largest magnitude."""

from __future__ import annotations

from globaldl.compression.candidates import top_k_indices
from globaldl.compression.sparsifier import SPARSIFIERS, Sparsifier


@SPARSIFIERS.register
class TopK(Sparsifier):
    """Keeps exactly the ``num_kept`` largest magnitudes of each tensor (ties broken by index).

    Large tensors find them among the candidates above a sampled threshold (candidates.py):
    the same entries as a top-k over the whole tensor, for a fraction of its cost.
    """

    name = "topk"

    def select(self, magnitudes, num_kept, seed):  # noqa: D102
        return top_k_indices(magnitudes, num_kept, seed)
