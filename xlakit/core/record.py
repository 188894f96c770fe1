"""StepRecord: the one plain-data description of an execution that every view reads."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import threading
from collections.abc import Collection, Sequence
from typing import NamedTuple

from ..config import config
from .ir import Source


class Trigger(enum.StrEnum):
    """What caused an execution (equal to its name as a string: "mark_step", ...)."""

    MARK_STEP = "mark_step"   # a step marker: xlakit.mark_step(), %%xla_step, torch_xla's sync()
    SYNC = "sync"             # xlakit.sync(), all tensors or some
    ITEM = "item"             # .item() and Python's bool/int/float of a tensor
    CPU = "cpu"               # .cpu(), .numpy(), print, ...
    SAVE = "save"             # xlakit.save()
    FALLBACK = "fallback"     # an op with no lowering ran eagerly and needed its inputs
    DYNAMO = "dynamo"         # the torch.compile backend


class Cache(enum.StrEnum):
    """Where the executable came from."""

    HIT = "hit"                        # the in-memory cache
    MISS = "miss"                      # compiled
    PERSISTENT_HIT = "persistent_hit"  # loaded from the disk cache, not compiled


class Backend(enum.StrEnum):
    """Whose executor ran the step."""

    XLAKIT = "xlakit"
    TORCH_XLA = "torch_xla"   # the real torch_xla executor, through xlakit/torch_xla.py


class Output(NamedTuple):
    """Output `output` of node number `node` of a GraphInfo (equal to the pair)."""

    node: int
    output: int


# where a node's operand comes from: an input (parameter index) or another node's output
Operand = int | Output


@dataclasses.dataclass(frozen=True)
class DonatedBuffer:
    index: int | None     # parameter index in the executable; None: unknown (torch_xla)
    label: str | None     # tensor label (module parameter name) if known
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int | None


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    op: str
    operands: tuple[Operand, ...]  # per operand: an int param index, or an Output
    avals: tuple[str, ...]
    source: Source | None          # the user's line and the library line that recorded the op
    split: bool = False            # the graph was cut here (an eager fallback or a sync)
    args: str = ""                 # its arguments, operands as $0, $1, ...: constants are in the key
    partition: int | None = None   # explain's FX graphs: the executable this FX node went to
    module: str = ""               # the module path that recorded it ("model.layers.3.self_attn"); "" at top level
    hlo_ops: tuple[str, ...] = ()  # the optimized HLO instructions it became (names in StepRecord.hlo)

    def __post_init__(self):
        if not all(isinstance(o, (int, Output)) for o in self.operands):
            object.__setattr__(self, "operands", tuple(o if isinstance(o, int) else Output(*o)
                                                       for o in self.operands))


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    aval: str | None      # None: unknown
    label: str | None
    donated: bool
    sharding: str = ""    # its placement, in the key: "one device", "replicated", "('data', None)"; "": unknown


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    nodes: tuple[NodeInfo, ...]
    params: tuple[ParamInfo, ...]
    roots: tuple[Output, ...]

    def __post_init__(self):
        if not all(isinstance(r, Output) for r in self.roots):
            object.__setattr__(self, "roots", tuple(Output(*r) for r in self.roots))


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
class MemoryInfo:
    """Bytes one device holds while the executable runs, from XLA's memory analysis
    of the compiled executable (known before it runs). `aliased` are outputs written
    into donated inputs: counted in both arguments and outputs, held once."""

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    peak: int
    code: int = 0          # generated code, where the device holds it
    devices: int = 1       # devices that each hold this much (one program per device)
    device_limit: int | None = None   # the device's memory, where its runtime says (GPU, TPU)

    @property
    def allocated(self) -> int:
        """Bytes of all the executable's buffers and code, each held once: more than
        `peak` where buffers of its schedule are not all live at once."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code


@dataclasses.dataclass(frozen=True)
class CostInfo:
    """XLA's cost analysis of the compiled executable: estimates, per device."""

    flops: float
    bytes_accessed: float
    transcendentals: float = 0.0


@dataclasses.dataclass(frozen=True)
class MeshInfo:
    """The devices an executable runs on, as a mesh of named axes."""

    shape: tuple[int, ...]          # devices along each axis
    axis_names: tuple[str, ...]
    devices: tuple[int, ...]        # device ids, row-major over the mesh

    @property
    def size(self) -> int:
        return len(self.devices)


@dataclasses.dataclass(frozen=True)
class TensorSharding:
    """How one input or output of an executable is laid out over the mesh."""

    aval: str                       # the whole tensor, "f32[8,16]"
    shape: tuple[int, ...]
    axes: tuple[tuple[str, ...], ...] | None  # per dim, the mesh axes it is split over (() = whole);
    #                                           None: a layout mesh axes do not describe (see `spec`)
    spec: str                       # "('data', None)", "replicated", or XLA's notation
    shard_shape: tuple[int, ...]    # the piece each device holds
    nbytes: int                     # the whole tensor's bytes
    shard_bytes: int                # the bytes each device holds

    @property
    def replicated(self) -> bool:
        """Whole on every device of the mesh."""
        return self.spec == "replicated"


@dataclasses.dataclass(frozen=True)
class ShardingInfo:
    """The executable's input and output shardings after propagation (GSPMD/Shardy)."""

    mesh: MeshInfo
    inputs: tuple[TensorSharding, ...]
    outputs: tuple[TensorSharding, ...]


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective in the optimized HLO: what it moves, per device."""

    op: str                         # all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    name: str                       # the HLO instruction ("all-reduce.1")
    shape: str                      # its result on one device ("f32[16,16]")
    nbytes: int                     # bytes of that result
    group_size: int | None          # devices in each group (pairs for collective-permute); None: unknown


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One execution. `trigger`, `cache` and `backend` are enums equal to their
    strings ("mark_step", "hit", "xlakit", ...), and are given as either. A value
    the executor does not report (torch_xla's) is None."""

    index: int
    trigger: Trigger
    key: str
    components: dict[str, str]
    metadata_digest: str | None
    cache: Cache
    donated: tuple[DonatedBuffer, ...]
    num_nodes: int
    num_inputs: int
    num_outputs: int
    timings: Timings
    graph: GraphInfo
    changed: tuple[str, ...] = ()   # on a miss: components that differ from the closest cached key
    why: tuple[str, ...] = ()       # on a miss: what differs, in words ("input 0 now f32[3], was f32[4]")
    uses: int | None = 1            # how many times this executable has run, this one included
    cache_entries: int | None = 0   # executables in the in-memory cache after this step
    hit_rate: float | None = 0.0    # in-memory cache hits / lookups so far, this one included
    hlo: str | None = dataclasses.field(default="", repr=False)  # the executable's optimized HLO
    backend: Backend = Backend.XLAKIT
    donation_note: str = ""         # why nothing (or not more) was donated
    source: str | None = None       # the user's line that caused the execution ("cell 4 line 3")
    memory: MemoryInfo | None = None  # per device, from the compiled executable
    cost: CostInfo | None = None      # per device, XLA's estimates
    shardings: ShardingInfo | None = None  # None: the step ran on one device
    collectives: tuple[Collective, ...] = ()  # in the optimized HLO

    def __post_init__(self):
        for name, kind in (("trigger", Trigger), ("cache", Cache), ("backend", Backend)):
            value = getattr(self, name)
            if type(value) is not kind:
                object.__setattr__(self, name, kind(value))

    @property
    def donated_bytes(self) -> int | None:
        """Bytes donated; None when a buffer's size is unknown."""
        sizes = [d.nbytes for d in self.donated]
        return None if None in sizes else sum(sizes)

    def __repr__(self) -> str:
        return text(self)


def text(record: StepRecord, name: str | None = None, changed: Collection[str] = (),
         why: Sequence[str] | None = None) -> str:
    """The plain text of a record: its repr, and the notebook's text view, which
    passes the components to mark *changed* and its own `why` lines. Deterministic
    (no timings, no addresses), so terminals and nbval see something true."""
    title = f"step {record.index}" + (f" [{name}]" if name else "") + \
        ("" if record.backend is Backend.XLAKIT else f" ({record.backend})")
    lines = [f"{title}: trigger={record.trigger} {cache_line(record)} key={record.key[:16]}",
             f"  graph: {record.num_nodes} nodes, {record.num_inputs} inputs, {record.num_outputs} outputs"]
    if record.source:
        lines.append(f"  at {record.source}")
    lines.append(f"  key components ({key_owner(record)}):")
    for c, v in record.components.items():
        lines.append(f"    {c:<8} {v[:16]}{'  *changed*' if c in changed else ''}")
    lines.append(f"    metadata {(record.metadata_digest or 'unknown')[:16]} (not in key)"
                 f"{'  *changed*' if 'metadata' in changed else ''}")
    lines += [f"  why: {line}" for line in (why_lines(record) if why is None else why)]
    lines += [f"  donation: {line}" for line in donation_lines(record)]
    lines += [f"  sharding: {line}" for line in sharding_lines(record)]
    lines += [f"  memory: {line}" for line in memory_lines(record)]
    lines.append(f"  cost: {cost_line(record)}")
    return "\n".join(lines)


def key_owner(record: StepRecord) -> str:
    return "in key" if record.backend is Backend.XLAKIT else f"in {record.backend}'s key"


def cache_line(record: StepRecord) -> str:
    if record.cache is Cache.HIT:
        return "cache hit" if record.uses is None else f"cache hit ({_ordinal(record.uses)} use)"
    if record.cache is Cache.PERSISTENT_HIT:
        return "persistent cache hit (loaded from disk, not compiled)"
    return "cache miss: compiled"


def why_lines(record: StepRecord) -> list[str]:
    """Why the step hit or missed, as its executor said (on a miss, the engine's
    comparison with the closest cached key)."""
    if record.cache is Cache.HIT:
        return [cache_line(record)]
    if record.backend is not Backend.XLAKIT:
        return [cache_line(record), *record.why]
    if not record.changed:
        return ["first compilation of this graph (nothing similar cached)"]
    return [f"differs from the closest cached key in: {', '.join(record.changed)}", *record.why]


def donation_lines(record: StepRecord) -> list[str]:
    if not record.donated:
        if record.backend is not Backend.XLAKIT and record.cache is Cache.HIT:
            return [f"unknown: {record.donation_note}"]   # torch_xla says only when it compiles
        return [f"nothing donated{': ' + record.donation_note if record.donation_note else ''}"]
    total = record.donated_bytes
    lines = [f"{len(record.donated)} buffer(s) donated"
             + (f", {human_bytes(total)} reused" if total is not None else "")]
    lines += [f"  input {d.index} {d.label or '(unlabelled)'} {d.dtype}{list(d.shape)} {human_bytes(d.nbytes)}"
              for d in record.donated if d.index is not None]  # torch_xla says how many, not which
    if record.donation_note:
        lines.append(f"  {'not donated' if record.backend is Backend.XLAKIT else 'note'}: {record.donation_note}")
    return lines


def sharding_lines(record: StepRecord) -> list[str]:
    """Mesh, how many inputs and outputs are split, memory per device and collectives; none on one device."""
    info = record.shardings
    if info is None:
        return []
    mesh = info.mesh
    axes = ", ".join(f"{name}={size}" for name, size in zip(mesh.axis_names, mesh.shape))
    split = [sum(not t.replicated for t in group) for group in (info.inputs, info.outputs)]
    lines = [f"mesh ({axes}) over {mesh.size} devices; split: {split[0]} of {len(info.inputs)} inputs, "
             f"{split[1]} of {len(info.outputs)} outputs (the rest replicated)"]
    if record.memory is not None:
        lines.append(f"per device: peak {human_bytes(record.memory.peak)}, "
                     f"arguments {human_bytes(record.memory.arguments)}")
    counts = collections.Counter(c.op for c in record.collectives)
    lines.append("collectives: " + (", ".join(f"{n} {op}" for op, n in sorted(counts.items())) or "none")
                 + (f", {human_bytes(sum(c.nbytes for c in record.collectives))}" if counts else ""))
    return lines


def memory_lines(record: StepRecord) -> list[str]:
    """The executable's memory per device in one line (its peak, and what it
    allocates, as a sum), and a second one when the peak exceeds the device's memory."""
    m = record.memory
    if m is None:
        return [f"unknown ({record.backend} gives no memory analysis of this executable)"]
    per = f"on each of {m.devices} devices" if m.devices > 1 else "per device"
    aliased = f" - {human_bytes(m.aliased)} written into donated inputs" if m.aliased else ""
    code = f" + code {human_bytes(m.code)}" if m.code else ""
    lines = [f"peak {human_bytes(m.peak)} {per} (buffers live at once, XLA's count); allocated "
             f"{human_bytes(m.allocated)} = arguments {human_bytes(m.arguments)} + outputs {human_bytes(m.outputs)}"
             f"{aliased} + temporaries {human_bytes(m.temporaries)}{code}"]
    if over_limit(m):
        lines.append(f"the peak is more than the device's {human_bytes(m.device_limit)}: "
                     "this step will likely run out of memory")
    return lines


def over_limit(memory: MemoryInfo | None) -> bool:
    return memory is not None and memory.device_limit is not None and memory.peak > memory.device_limit


def cost_line(record: StepRecord) -> str:
    c = record.cost
    if c is None:
        return f"unknown ({record.backend} gives no cost analysis of this executable)"
    return (f"{human_flops(c.flops)}, {human_bytes(round(c.bytes_accessed))} accessed per device "
            "(XLA's estimates)")


def human_flops(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f} FLOP" if unit == "" else f"{n:.1f} {unit}FLOP"
        n /= 1000
    return f"{n:.1f} TFLOP"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class _OpenCaptures(threading.local):
    def __init__(self):
        self.open: list[list[StepRecord]] = []


class StepLog:
    """The one log of StepRecords, the engine's and torch_xla's adapter's alike.

    Keeps the newest `config.record_limit` records (a long training run must not
    grow memory without bound). `capture()` gives exactly the records appended
    while it is open, however many the bound drops meanwhile, by its own thread:
    a sync another thread runs meanwhile is not the block's.
    """

    def __init__(self):
        self.records: collections.deque[StepRecord] = collections.deque(maxlen=config.record_limit)
        self.next_index = 0                     # the index the next record takes
        self._threads = _OpenCaptures()         # .open: the lists of this thread's captures now open

    def append(self, record: StepRecord) -> None:
        if record.index != self.next_index:
            raise ValueError(f"record #{record.index} appended where #{self.next_index} comes next")
        if self.records.maxlen != config.record_limit:
            self.records = collections.deque(self.records, maxlen=config.record_limit)
        self.records.append(record)
        self.next_index += 1
        for steps in self._threads.open:
            steps.append(record)

    def clear(self) -> None:
        """Forget the kept records; numbering goes on, open captures keep theirs."""
        self.records.clear()

    def restart(self) -> None:
        """Forget the kept records and number from 0 again, as a fresh process does."""
        self.records.clear()
        self.next_index = 0

    @contextlib.contextmanager
    def capture(self):
        """`with log.capture() as steps:` -- `steps` is a list that receives every
        record this thread appends until the block ends (also when it raises); captures nest."""
        steps: list[StepRecord] = []
        open_ = self._threads.open
        open_.append(steps)
        try:
            yield steps
        finally:
            del open_[next(i for i, s in enumerate(open_) if s is steps)]
