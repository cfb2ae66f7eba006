"""Variable shapes of ResNet-20 for CIFAR-10 (He et al. 2016, identity shortcuts): 269,722."""

from __future__ import annotations


def resnet20_shapes() -> list[tuple[int, ...]]:
    """Kernels without bias, then batch-norm gamma and beta per convolution, then the classifier."""
    shapes: list[tuple[int, ...]] = [(3, 3, 3, 16), (16,), (16,)]
    channels_in = 16
    for channels in (16, 32, 64):
        for _ in range(3):
            for _ in range(2):
                shapes += [(3, 3, channels_in, channels), (channels,), (channels,)]
                channels_in = channels
    return shapes + [(64, 10), (10,)]
