"""Indexing ops: advanced indexing, gather/scatter, index_select/add/copy/fill,
index_put, masked ops, embedding and its backward."""
from __future__ import annotations

from . import lowers  # noqa: F401
