"""StepRecord: the one plain-data description of an execution that every view reads."""
from __future__ import annotations

import collections
import contextlib
import dataclasses

from .config import config
from .ir import Source


@dataclasses.dataclass(frozen=True)
class DonatedBuffer:
    index: int            # parameter index in the executable
    label: str | None     # tensor label (module parameter name) if known
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    op: str
    operands: tuple              # per operand: an int param index, or (node, output)
    avals: tuple[str, ...]
    source: Source | None        # the user's line and the library line that recorded the op
    split: bool = False          # the graph was cut here (an eager fallback or a sync)
    args: str = ""               # its arguments, operands as $0, $1, ...: constants are in the key


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    aval: str
    label: str | None
    donated: bool


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    nodes: tuple[NodeInfo, ...]
    params: tuple[ParamInfo, ...]
    roots: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Timings:
    trace: float = 0.0     # seconds spent recording ops since the previous execution
    lower: float = 0.0
    compile: float = 0.0
    execute: float = 0.0
    # False when the step was only dispatched (config.wait_for_execution off):
    # `execute` is then the time to enqueue it, not to run it
    waited: bool = True


@dataclasses.dataclass(frozen=True)
class StepRecord:
    index: int
    trigger: str          # "mark_step", "sync", "item", "cpu", "save", "fallback", ...
    key: str
    components: dict[str, str]
    metadata_digest: str
    cache: str            # "hit", "miss", "persistent_hit"
    donated: tuple[DonatedBuffer, ...]
    num_nodes: int
    num_inputs: int
    num_outputs: int
    timings: Timings
    graph: GraphInfo
    changed: tuple[str, ...] = ()   # on a miss: components that differ from the closest cached key
    why: tuple[str, ...] = ()       # on a miss: what differs, in words ("input 0 now f32[3], was f32[4]")
    uses: int = 1                   # how many times this executable has run, this one included
    cache_entries: int = 0          # executables in the in-memory cache after this step
    hit_rate: float = 0.0           # in-memory cache hits / lookups so far, this one included
    hlo: str = dataclasses.field(default="", repr=False)  # the executable's optimized HLO
    backend: str = "xlakit"         # "xlakit", or "torch_xla" for records of the real torch_xla executor
    donation_note: str = ""         # why nothing (or not more) was donated
    source: str | None = None       # the user's line that caused the execution ("cell 4 line 3")

    @property
    def donated_bytes(self) -> int:
        return sum(d.nbytes for d in self.donated)

    def __repr__(self) -> str:
        lines = [
            f"StepRecord #{self.index} trigger={self.trigger} cache={self.cache} key={self.key[:16]}",
            f"  nodes={self.num_nodes} inputs={self.num_inputs} outputs={self.num_outputs}",
        ]
        for name, value in self.components.items():
            lines.append(f"  {name:<8} {value[:16]}")
        lines.append(f"  metadata {self.metadata_digest[:16]} (not in key)")
        if self.changed:
            lines.append(f"  changed vs closest cached key: {', '.join(self.changed)}")
        lines.extend(f"    {line}" for line in self.why)
        if self.donated:
            for d in self.donated:
                lines.append(f"  donated #{d.index} {d.label or ''} {d.dtype}{list(d.shape)} {d.nbytes} B")
        else:
            lines.append(f"  donated nothing{': ' + self.donation_note if self.donation_note else ''}")
        return "\n".join(lines)


class StepLog:
    """The one log of StepRecords, the engine's and torch_xla's adapter's alike.

    Keeps the newest `config.record_limit` records (a long training run must not
    grow memory without bound). `capture()` gives exactly the records appended
    while it is open, however many the bound drops meanwhile.
    """

    def __init__(self):
        self.records: collections.deque[StepRecord] = collections.deque(maxlen=config.record_limit)
        self.next_index = 0                     # the index the next record takes
        self._open: list[list[StepRecord]] = []  # the lists of the captures now open

    def append(self, record: StepRecord) -> None:
        if record.index != self.next_index:
            raise ValueError(f"record #{record.index} appended where #{self.next_index} comes next")
        if self.records.maxlen != config.record_limit:
            self.records = collections.deque(self.records, maxlen=config.record_limit)
        self.records.append(record)
        self.next_index += 1
        for steps in self._open:
            steps.append(record)

    def clear(self) -> None:
        """Forget the kept records; numbering goes on, open captures keep theirs."""
        self.records.clear()

    @contextlib.contextmanager
    def capture(self):
        """`with log.capture() as steps:` -- `steps` is a list that receives every
        record appended until the block ends (also when it raises); captures nest."""
        steps: list[StepRecord] = []
        self._open.append(steps)
        try:
            yield steps
        finally:
            del self._open[next(i for i, s in enumerate(self._open) if s is steps)]
