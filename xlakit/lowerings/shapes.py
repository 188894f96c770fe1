# HELPER, READ FIRST: your instructions continue in /tmp/helper_common.md (read it all now). Work ONLY in your own
# git worktree (/work/wt-FAMILY on branch low-FAMILY from branch `stacks`), never in /work/main; never `git stash`.
# (Delete this note in your worktree copy.)
"""Shape and layout ops: views (and their functional `_copy` forms), reshape,
permute, expand, slicing, concatenation, splitting, padding, flips, and the
scatter-into-a-view ops."""
from __future__ import annotations

from . import lowers  # noqa: F401
