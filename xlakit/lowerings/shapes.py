"""Shape and layout ops: views (and their functional `_copy` forms), reshape,
permute, expand, slicing, concatenation, splitting, padding, flips, and the
scatter-into-a-view ops."""
from __future__ import annotations

from . import lowers  # noqa: F401
