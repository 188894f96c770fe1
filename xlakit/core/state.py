"""What xlakit keeps in the process: every cache, memo and history, each with its
bound and why it is kept, in one registry; `xlakit.reset()` empties them all.

A module keeps its state here, where it declares it: `PROCESS.memo(...)` and
`PROCESS.seen(...)` give a bounded dict and set, `PROCESS.keep(...)` registers an
object of its own. `PROCESS.held()` lists what the imported modules hold, with
their sizes now. A bounded one forgets its oldest entries (or any one, for a set):
each user computes again, or warns again, what it no longer finds.

Not here, because reset keeps them (they describe objects the user holds and die
with them): the engine's live tensors and the pending work they wait on, tensor
labels (front/labels), the host's copies of uploads (core/transfer), owned tensors and their buffers (front/tensor,
engine/check_results.Ledger.latest), modules' names and shared parameters
(core/module_paths, front/modules), open widgets (notebook/views), the numbers
that order live objects (ir.Node.seq, owner ids), open captures, the settings
(config), the disk cache, and what install() patched in torch and JAX. Memos of
facts about the installed torch (functools caches keyed by dtype or nothing) are
constants, not state.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


class Memo(dict):
    """A dict of at most `bound` entries: adding one more forgets the oldest added."""

    def __init__(self, bound: int):
        super().__init__()
        self.bound = bound

    def __setitem__(self, key, value) -> None:
        if len(self) >= self.bound and key not in self:
            del self[next(iter(self))]
        super().__setitem__(key, value)


class Seen(set):
    """A set of at most `bound` items (what was warned about, what failed once):
    adding one more forgets any one, which is then noticed again if it recurs."""

    def __init__(self, bound: int):
        super().__init__()
        self.bound = bound

    def add(self, item) -> None:
        if len(self) >= self.bound and item not in self:
            self.pop()
        super().add(item)


class Last:
    """A one-slot memo: the value made for the last arguments, found by identity
    (one display asks for the same view several times)."""

    def __init__(self):
        self._args: tuple = ()
        self._value = None

    def get(self, *args):
        same = len(args) == len(self._args) and all(a is b for a, b in zip(args, self._args))
        return self._value if same else None

    def put(self, value, *args):
        self._args, self._value = args, value
        return value

    def clear(self) -> None:
        self._args, self._value = (), None

    def __len__(self) -> int:
        return 1 if self._args else 0


class Numbering:
    """0, 1, 2, ... for things made in order; clear() starts again at 0."""

    def __init__(self):
        self.issued = 0

    def __next__(self) -> int:
        number, self.issued = self.issued, self.issued + 1
        return number

    def clear(self) -> None:
        self.issued = 0

    def __len__(self) -> int:
        return self.issued


@dataclasses.dataclass
class Held:
    """One thing the process keeps."""

    name: str                   # "module: what"
    value: object
    bound: int | str            # most entries kept; a text where the bound is a setting or per object
    why: str
    clear: Callable[[], object]
    size: Callable[[], int]


class ProcessState:
    """The registry of everything xlakit keeps (module docstring)."""

    def __init__(self):
        self._held: dict[str, Held] = {}

    def keep(self, name: str, value, *, bound: int | str, why: str, clear=None, size=None):
        """Register `value` (emptied by its clear(), sized by len() unless given); returns it.
        A module imported again replaces its entry."""
        self._held[name] = Held(name, value, bound, why, clear or value.clear, size or value.__len__)
        return value

    def memo(self, name: str, bound: int, why: str) -> Memo:
        return self.keep(name, Memo(bound), bound=bound, why=why)

    def seen(self, name: str, bound: int, why: str) -> Seen:
        return self.keep(name, Seen(bound), bound=bound, why=why)

    def held(self) -> list[Held]:
        return list(self._held.values())

    def sizes(self) -> dict[str, int]:
        return {held.name: held.size() for held in self._held.values()}

    def reset(self) -> None:
        for held in list(self._held.values()):
            held.clear()


PROCESS = ProcessState()
