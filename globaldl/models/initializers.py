"""Seeded weight initialisers: one distinct, reproducible seed per layer of a model."""

from __future__ import annotations

import tf_keras as keras

# Large odd multiplier so seeds of neighbouring models (seed, seed + 1) never share layer seeds.
_SEED_STRIDE = 1_000_003
_SEED_MODULUS = 2**31 - 1


class LayerSeeds:
    """Hands out kernel initialisers with seeds derived from one model seed.

    Keras 2 seeded initialisers are stateless: the same seed and shape always give the same
    values. Every layer therefore needs its own seed (else two layers of equal shape would start
    identical); this class numbers them in build order, so two builds of the same architecture
    with the same model seed get identical weights, without touching global random state.

    Example:
        seeds = LayerSeeds(seed=7)
        keras.layers.Dense(10, kernel_initializer=seeds.glorot_uniform())

    """

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self._seed = seed
        self._layers_seeded = 0

    def next_seed(self) -> int:
        """The seed for the next layer in build order."""
        self._layers_seeded += 1
        return (self._seed * _SEED_STRIDE + self._layers_seeded) % _SEED_MODULUS

    def glorot_uniform(self) -> keras.initializers.Initializer:
        """Keras' default Dense/Conv initialiser, seeded."""
        return keras.initializers.GlorotUniform(seed=self.next_seed())

    def he_normal(self) -> keras.initializers.Initializer:
        """He et al. (2015) initialiser for ReLU networks, seeded."""
        return keras.initializers.HeNormal(seed=self.next_seed())
