"""StepRecord: the one plain-data description of an execution that every view reads."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import threading
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
    COMPILED = "compiled"     # a torch.compile graph's executable, run again on device buffers


class Cache(enum.StrEnum):
    """Where the executable came from."""

    HIT = "hit"                        # the in-memory cache
    MISS = "miss"                      # compiled
    PERSISTENT_HIT = "persistent_hit"  # loaded from the disk cache, not compiled


class Backend(enum.StrEnum):
    """Whose executor ran the step."""

    XLAKIT = "xlakit"
    TORCH_XLA = "torch_xla"   # the real torch_xla executor, through integrations/torch_xla.py


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
class Replay:
    """How the ops of an execution were recorded (engine/tape.py): `replayed` matched the
    run that followed the same sync before and reused its recording; `recorded` were
    recorded in full; `why`: where the run stopped matching ("" if it never did)."""

    replayed: int
    recorded: int
    why: str = ""


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

    @property
    def over_limit(self) -> bool:
        """The peak is more than the device's memory (where its runtime says how much)."""
        return self.device_limit is not None and self.peak > self.device_limit


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
class ProfiledOp:
    """One optimized HLO instruction's measured time (one run) and what it came from.
    A fusion of several nodes lists them all: `split`, its time is shared among them
    (in `ProfileInfo.by_module`) by their estimated FLOPs. One with no nodes is XLA's
    own (`xla_own` says what: a layout copy, a tuple, ...)."""

    hlo_op: str                   # the instruction's name in StepRecord.hlo ("fusion.3")
    seconds: float
    nodes: tuple[int, ...]        # indices into StepRecord.graph.nodes
    module: str                   # the module path of its largest share ("" top level)
    source: Source | None         # the user's (and library's) line of its largest share
    flops: float                  # estimated from its nodes (analysis/flops.py)
    bytes: float                  # its operands and result, from the optimized HLO's shapes
    opcode: str = ""              # fusion, dot, copy, ...
    split: bool = False
    xla_own: str = ""             # why no node made it; "" when nodes did


@dataclasses.dataclass(frozen=True)
class ProfileInfo:
    """Where one run of the step's executable spent its time, measured with JAX's profiler
    (the median of `runs` runs). `by_module` keys are module paths ("model.layers.0.mlp",
    "backward.model.layers.0.mlp", "optimizer"), "(top level)" for ops outside any
    module, "(XLA's own)" for ops no node made."""

    device_seconds: float         # the executable's time on the device, first op's start to last op's end
    op_seconds: float             # the ops' own times summed (ops may overlap on a CPU's threads)
    ops: tuple[ProfiledOp, ...]   # slowest first
    by_module: dict[str, float]
    by_line: dict[str, float]     # per user line ("cell 4 line 3", "train.py:12")
    coverage: float               # share of op_seconds attributed to nodes
    runs: int
    overhead_seconds: float       # what profiling cost: input copies, the runs, reading the trace
    platform: str = ""            # "cpu", "gpu", "tpu"


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """The op that made a step's first NaN or infinity from finite inputs (config.check_nans)."""

    node: int                       # its position in StepRecord.graph.nodes
    op: str                         # "aten.log.default"
    module: str                     # "model.layers.3.mlp", "backward.model.layers.3.mlp", "optimizer", ""
    source: Source | None           # the user's line and the library line that recorded it
    kind: str                       # "nan" or "inf": what it made
    inputs: tuple[tuple[float, float] | None, ...] = ()  # (min, max) of each of its first inputs' finite
    #                                                      values; None: not floating point, or none finite


@dataclasses.dataclass(frozen=True)
class ModuleRange:
    """How large a module's values got in one step (config.record_ranges)."""

    absmax: float                   # the largest absolute finite value its ops computed
    dtype: str                      # the dtype of those values ("bf16")
    limit: float                    # that dtype's largest finite value
    tiny: float                     # that dtype's smallest normal value

    @property
    def headroom(self) -> float:
        """limit / absmax: how many times larger its values may grow before they overflow."""
        return self.limit / self.absmax if self.absmax > 0 else float("inf")

    @property
    def underflows(self) -> bool:
        """All its values are zero or below the dtype's normal range (subnormal)."""
        return self.absmax < self.tiny


@dataclasses.dataclass(frozen=True)
class NumericsInfo:
    """What a step's executable found about its values (config.check_nans, config.record_ranges)."""

    first_nonfinite: NonFinite | None = None   # None: no op made a NaN or infinity (or check_nans was off)
    ranges: dict[str, ModuleRange] | None = None   # per module path; None: ranges were not asked for
    nans_checked: bool = False                     # whether check_nans looked for a first_nonfinite
    # whether the step was run again, node by node, to find it: check_nans alone runs a step with a
    # guard on its outputs, and searches only a step whose outputs are not finite (engine/numerics.py)
    searched: bool = False
    nonfinite_outputs: bool = False                # whether the step's outputs hold a NaN or an infinity
    # the nodes of the outputs that hold a NaN or an infinity made in the step's in-place updates of
    # donated buffers from finite values: not searched, the step had written those buffers
    in_updates: tuple[int, ...] = ()

    @property
    def by_module(self) -> dict[str, float]:
        """{module path: absolute maximum} ({} when ranges were not asked for)."""
        return {path: r.absmax for path, r in (self.ranges or {}).items()}


@dataclasses.dataclass(frozen=True, repr=False)
class StepRecord:
    """One execution. `trigger`, `cache` and `backend` are enums equal to their
    strings ("mark_step", "hit", "xlakit", ...). A value the executor does not
    report (torch_xla's) is None. It prints as the step view's text: the words are
    notebook/render.py's, and xlakit/__init__ binds them (core imports nothing above it)."""

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
    hlo: str | None = ""            # the executable's optimized HLO
    backend: Backend = Backend.XLAKIT
    donation_note: str = ""         # why nothing (or not more) was donated
    source: str | None = None       # the user's line that caused the execution ("cell 4 line 3")
    memory: MemoryInfo | None = None  # per device, from the compiled executable
    cost: CostInfo | None = None      # per device, XLA's estimates
    shardings: ShardingInfo | None = None  # None: the step ran on one device
    collectives: tuple[Collective, ...] = ()  # in the optimized HLO
    replay: Replay | None = None      # how its ops were recorded; None: not by xlakit's recorder
    profile: ProfileInfo | None = None  # measured, when it ran inside xlakit.profile()
    numerics: NumericsInfo | None = None  # with config.check_nans or record_ranges; None: neither was on

    @property
    def donated_bytes(self) -> int | None:
        """Bytes donated; None when a buffer's size is unknown."""
        sizes = [d.nbytes for d in self.donated]
        return None if None in sizes else sum(sizes)

    def rerun(self, **changes) -> StepRecord:
        """The record of this record's executable run again the same way (same graph, key and
        cache outcome): a copy with `changes`. A compiled function's replay makes one at every
        call; copying the fields skips the dataclass __init__, which sets its frozen fields one
        by one (~3 µs of a ~190 µs call)."""
        unknown = changes.keys() - _STEP_FIELDS
        if unknown:
            raise TypeError(f"StepRecord.rerun: no field {', '.join(sorted(unknown))}")
        record = object.__new__(StepRecord)
        record.__dict__.update(self.__dict__, **changes)
        return record


_STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(StepRecord))


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

    def revise(self, record: StepRecord, **changes) -> StepRecord:
        """Replace the newest record, this thread's, by a copy with `changes` (torch.compile's
        backend adds Dynamo's recompile reason to a miss's `why`); returns the copy."""
        if not self.records or self.records[-1] is not record:
            raise ValueError(f"record #{record.index} is not the newest")
        revised = dataclasses.replace(record, **changes)
        self.records[-1] = revised
        for steps in self._threads.open:
            if steps and steps[-1] is record:
                steps[-1] = revised
        return revised

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
