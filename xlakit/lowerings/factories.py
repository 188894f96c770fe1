"""Tensor factories: full, zeros, ones, empty, arange, eye, scalar_tensor,
linspace and the *_like / new_* forms; casts (_to_copy)."""
from __future__ import annotations

from . import lowers  # noqa: F401
