"""The recompile budget: a loop or a cell that compiles more than N times after its first step.

A training loop should compile once (its first step, maybe a second for the optimizer's
state) and then hit the cache; one that compiles at every step (a changing shape, a Python
number baked into the graph) spends its time in XLA's compiler. `config.max_recompiles`
counts the compiles of the steps each user line ran after its first one (the line of the
step marker in a loop); `%%xla_step --max-compiles N` counts one run of a cell's. Over the budget, a
warning (with `config.strict_recompiles`, an error) names each miss's why and compile time.
"""
from __future__ import annotations

import collections

from ..config import config
from ..core import sources
from ..core.record import Cache, StepRecord
from ..core.state import PROCESS

LINES_KEPT = 1024
MISSES_SHOWN = 8  # the newest misses a message names


class RecompileWarning(UserWarning):
    """A loop or cell compiled more often than its budget allows."""


class RecompileBudgetError(RuntimeError):
    """A loop or cell compiled more often than its budget allows (config.strict_recompiles)."""


def recompiles(records: list[StepRecord]) -> list[StepRecord]:
    """The steps after the first that compiled (cache misses)."""
    return [r for r in records[1:] if r.cache == Cache.MISS]


def over_budget(where: str, misses: list[StepRecord], limit: int, setting: str, count: int | None = None) -> str | None:
    """The message when a loop or cell compiled `count` (default: len(misses)) times after its first
    step, more than `limit`; `misses`: those steps (the newest, where not all are kept). None within it."""
    count = len(misses) if count is None else count
    if count <= limit:
        return None
    shown = misses[-MISSES_SHOWN:]
    each = "; ".join(f"step #{r.index}: {', '.join(r.why) or 'no cached executable to compare with'} "
                     f"(compile {r.timings.compile * 1e3:.1f} ms)" for r in shown)
    spent = sum(r.timings.compile for r in shown)
    newest = f"the newest {len(shown)}: " if len(shown) < count else ""
    return (f"xlakit: {where} compiled {count} times after its first step, over the budget of {limit} "
            f"({setting}); {newest}{each}; {spent:.2f} s compiling. Make what changes static (pad to fixed "
            "shapes, pass changing numbers as tensors), or raise the budget.")


def enforce(message: str) -> None:
    """Raise the budget's error (config.strict_recompiles) or warn, at the user's line."""
    if config.strict_recompiles:
        raise RecompileBudgetError(message)
    sources.warn(message, sources.capture(), RecompileWarning)


class _Line:
    __slots__ = ("count", "misses", "warned")

    def __init__(self):
        self.count, self.misses, self.warned = 0, collections.deque(maxlen=MISSES_SHOWN), False


class LineBudget:
    """config.max_recompiles: each user line's steps (a loop's step marker), counted as recorded."""

    def __init__(self):
        self.lines: collections.OrderedDict[str, _Line] = collections.OrderedDict()

    def observe(self, record: StepRecord, limit: int, every: bool) -> str | None:
        """Count `record`; the message when its line is over `limit`: the first time, or
        `every` time; else None."""
        where = record.source or "a step with no user line"
        line = self.lines.get(where)
        if line is None:  # its first step
            self.lines[where] = _Line()
            while len(self.lines) > LINES_KEPT:
                self.lines.popitem(last=False)
            return None
        self.lines.move_to_end(where)
        if record.cache != Cache.MISS:
            return None
        line.count += 1
        line.misses.append(record)
        message = over_budget(f"the steps of {where}", list(line.misses), limit,
                              f"config.max_recompiles = {limit}", line.count)
        if message is None or (line.warned and not every):
            return None
        line.warned = True
        return message

    def clear(self) -> None:
        self.lines.clear()


LINES = LineBudget()
PROCESS.keep("analysis.budget: compiles per line", LINES, bound=f"{LINES_KEPT} lines, the newest {MISSES_SHOWN} "
             "misses of each", why="config.max_recompiles counts each line's compiles after its first step",
             clear=LINES.clear, size=lambda: len(LINES.lines))
