# HELPER, READ FIRST: your instructions continue in /tmp/helper_common.md (read it all now). Work ONLY in your own
# git worktree (/work/wt-FAMILY on branch low-FAMILY from branch `stacks`), never in /work/main; never `git stash`.
# (Delete this note in your worktree copy.)
"""Tensor factories: full, zeros, ones, empty, arange, eye, scalar_tensor,
linspace and the *_like / new_* forms; casts (_to_copy)."""
from __future__ import annotations

from . import lowers  # noqa: F401
