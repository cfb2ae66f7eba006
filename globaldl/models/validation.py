"""Argument checks shared by the model builders."""

from __future__ import annotations


def require_image_shape(model_name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Return (height, width, channels), or raise ValueError if ``input_shape`` is not an image."""
    if len(input_shape) != 3:
        raise ValueError(
            f"model {model_name!r} takes images of shape (height, width, channels), "
            f"got input_shape {tuple(input_shape)}"
        )
    height, width, channels = input_shape
    return height, width, channels


def require_clip_shape(model_name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Return (frames, height, width, channels), or raise ValueError if not a clip shape."""
    if len(input_shape) != 4:
        raise ValueError(
            f"model {model_name!r} takes clips of shape (frames, height, width, channels), "
            f"got input_shape {tuple(input_shape)}"
        )
    frames, height, width, channels = input_shape
    return frames, height, width, channels
