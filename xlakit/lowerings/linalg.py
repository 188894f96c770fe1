"""Matrix products, linear algebra and FFTs."""
from __future__ import annotations

from . import lowers  # noqa: F401
