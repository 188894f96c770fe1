"""The graph-break explorer: Dynamo's FX breaks next to HLO breaks, per path.

`explain(fn, *args)` RUNS `fn` once per path (Dynamo FX, Dynamo -> xlakit,
lazy xlakit, and torch_xla's LazyTensor and openxla paths when torch_xla is
installed). `fn` if a module, and the tensors, modules and optimizers among its
arguments, are copied for each path, so the caller's objects are not changed;
other side effects of `fn` (printing, globals, a model it closes over) happen
once per path. Where a tensor or module is on xlakit's device, the Dynamo paths
run on the device as the user's `torch.compile` would (parameters resident, each
FX graph one executable on the device buffers); otherwise on the host.

Each of Dynamo's breaks is kept with what explains it: the source around its
line, Dynamo's own type, code, explanation and hints (dynamo_reasons.py), the
FX graphs on either side of it (drawable, nodes by module path), and what
xlakit's backend made of each graph (its executables and HLO splits).
"""
from __future__ import annotations

import copy
import dataclasses
import linecache
import logging

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from .. import session
from ..core import module_paths, sources
from ..core.ir import Aval, Frame
from ..core.record import GraphInfo, NodeInfo, Output, ParamInfo, Trigger
from ..front import install
from ..front.recorder import DEVICE
from . import dynamo, dynamo_reasons, fx_interpreter

CONTEXT_LINES = 3  # source lines shown on each side of a break's line


@dataclasses.dataclass
class PathReport:
    path: str
    graphs: int                      # FX graphs, or executions per call
    breaks: int                      # FX breaks, HLO splits, or implicit syncs and fallbacks
    why: list[str]                   # where and why, one line each


@dataclasses.dataclass
class FxGraph:
    """One graph Dynamo captured, and what xlakit's backend made of it."""

    index: int
    graph: GraphInfo                             # torch-level ops, each with its module path and source line
    compiled: fx_interpreter.CompiledGraph | None  # executables, HLO splits, the aten graph by executable
    backward: fx_interpreter.CompiledGraph | None = None  # the same of its backward, where one ran

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.graph.nodes]


@dataclasses.dataclass
class GraphBreak:
    """One of Dynamo's graph breaks: where, why, and the graphs on either side."""

    index: int
    where: Frame | None                          # the line Dynamo stopped at (innermost traced frame)
    lines: list[tuple[int, str]]                 # the source around it: (line number, text)
    reason: str                                  # Dynamo's reason, as it gave it
    dynamo: dynamo_reasons.DynamoReason          # its type, registry code, explanation and hints
    before: int                                  # the FX graph that ends at this break
    after: int | None                            # the FX graph Dynamo captured next; None if none

    @property
    def at(self) -> str:
        return sources.short(self.where) or "?"


NOTE = "explain() ran the function once per path (on copies of its module and inputs)."
DEVICE_NOTE = ("explain() ran the function once per path (on copies of its module and inputs, "
               "the Dynamo paths on xlakit's device, where the inputs live).")


@dataclasses.dataclass
class BreakReport:
    paths: list[PathReport]
    fx_graphs: list[FxGraph]
    breaks: list[GraphBreak]
    note: str = NOTE

    def path(self, name: str) -> PathReport:
        return next(p for p in self.paths if p.path == name)

    @property
    def ops_per_graph(self) -> list[list[str]]:
        return [g.ops for g in self.fx_graphs]

    def __repr__(self) -> str:
        lines = [self.note, f"{'path':<34} {'graphs':>6} {'breaks':>6}  where and why"]
        for p in self.paths:
            lines.append(f"{p.path:<34} {p.graphs:>6} {p.breaks:>6}  {p.why[0] if p.why else ''}")
            lines += [f"{'':<49}{w}" for w in p.why[1:]]
        for g in self.fx_graphs:
            lines.append(f"FX graph {g.index}: {len(g.ops)} ops: {', '.join(g.ops[:12])}"
                         f"{' ...' if len(g.ops) > 12 else ''}{_executables(g)}")
        for b in self.breaks:
            lines.append(f"break {b.index} at {b.at} ({between(b)}): {b.dynamo}")
        return "\n".join(lines)


def between(b: GraphBreak) -> str:
    """'after FX graph 0, before FX graph 1'."""
    return f"after FX graph {b.before}" + (f", before FX graph {b.after}" if b.after is not None else "")


def _executables(g: FxGraph) -> str:
    return "".join(f" (xlakit{side}: {c.executables} executables, split at {', '.join(s.node for s in c.splits)})"
                   for side, c in (("", g.compiled), (", backward", g.backward)) if c is not None and c.executables > 1)


def explain(fn, *args, **kwargs) -> BreakReport:
    install.install()
    torch_xla = _torch_xla_with_device()  # before the other paths' backward(), if fn runs one
    home = _home(fn, args, kwargs)
    fx, captured, breaks = _dynamo_fx(fn, args, kwargs, home)
    compiled, compiled_graphs = _dynamo_xlakit(fn, args, kwargs, home)
    paths = [fx, compiled, _lazy_xlakit(fn, args, kwargs)]
    paths += _torch_xla_paths(fn, args, kwargs, torch_xla) if torch_xla is not None else []
    # both runs trace the same code with the same Dynamo: the same graphs, in the same order,
    # each compiled as AOTAutograd's forward and, where a backward ran, its backward
    forwards = [c for c in compiled_graphs if c.forward]
    matched = forwards if len(forwards) == len(captured) else [None] * len(captured)
    backward = {c.compile_id: c for c in compiled_graphs if not c.forward}
    fx_graphs = [FxGraph(i, _graph_info(gm), c, backward.get(c.compile_id) if c else None)
                 for i, (gm, c) in enumerate(zip(captured, matched))]
    return BreakReport(paths=paths, fx_graphs=fx_graphs, breaks=breaks, note=DEVICE_NOTE if home == DEVICE else NOTE)


_COPIED = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)


def _home(fn, args, kwargs) -> torch.device:
    """xlakit's device where a tensor argument, or a parameter or buffer of fn, of a module
    argument or of a module fn closes over or names as a global, is on it; else the host
    (a function of a module on the device, called on a host batch, runs on the device)."""
    tensors = []
    for value in tree_flatten((fn, args, kwargs, _read_by(fn)))[0]:
        if isinstance(value, torch.nn.Module):
            tensors += [*value.parameters(), *value.buffers()]
        elif isinstance(value, torch.Tensor):
            tensors.append(value)
    return DEVICE if any(t.device == DEVICE for t in tensors) else torch.device("cpu")


def _read_by(fn) -> list:
    """The modules and tensors a plain function reads from its closure and its globals."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    cells = [c.cell_contents for c in fn.__closure__ or () if c.cell_contents is not c]  # an empty cell raises
    names = [fn.__globals__[n] for n in code.co_names if n in fn.__globals__]
    return [v for v in (*cells, *names) if isinstance(v, (torch.nn.Module, torch.Tensor))]


def _moved(fn, args, kwargs, device):
    """Copies of fn (if a module) and of the tensors, modules and optimizers among the
    arguments, on `device`; copied with one memo, so that an optimizer's parameters are
    its copied module's."""
    memo: dict = {}

    def copied(value):
        if isinstance(value, torch.Tensor):
            return value.detach().clone().to(device).requires_grad_(value.requires_grad)
        value = copy.deepcopy(value, memo)
        return value.to(device) if isinstance(value, torch.nn.Module) else value

    return (copied(fn) if isinstance(fn, torch.nn.Module) else fn), *tree_map_only(_COPIED, copied, (args, kwargs))


def _dynamo_fx(fn, args, kwargs, home):
    torch._dynamo.reset()
    f, a, k = _moved(fn, args, kwargs, home)
    out = torch._dynamo.explain(f)(*a, **k)
    breaks, why = [], []
    for before, gm in enumerate(out.graphs):
        reason = gm.compile_subgraph_reason  # a graph ends at a break, or at its frame's return
        if not reason.graph_break:
            continue
        frame = reason.user_stack[-1] if reason.user_stack else None
        where = Frame(frame.filename, frame.lineno, frame.name) if frame else None
        after = before + 1 if before + 1 < len(out.graphs) else None
        b = GraphBreak(len(breaks) + 1, where, _lines_around(where), reason.reason,
                       dynamo_reasons.explain(reason.reason), before, after)
        breaks.append(b)
        why.append(f"{b.at}: {b.dynamo}")
    return PathReport("Dynamo FX", out.graph_count, out.graph_break_count, why), out.graphs, breaks


def _lines_around(where: Frame | None) -> list[tuple[int, str]]:
    """The source around a line (a notebook cell's too: IPython puts cells in linecache)."""
    if where is None:
        return []
    lines = linecache.getlines(where.file)
    first, last = max(1, where.line - CONTEXT_LINES), min(len(lines), where.line + CONTEXT_LINES)
    return [(n, lines[n - 1].rstrip("\n")) for n in range(first, last + 1)]


def _graph_info(gm: torch.fx.GraphModule) -> GraphInfo:
    """A graph Dynamo captured, as the views draw it: inputs (placeholders and
    attributes), ops with their shapes, arguments, module path (nn_module_stack)
    and source line (stack_trace)."""
    params, nodes, where = [], [], {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            where[node.name] = len(params)
            avals = _avals(node)
            params.append(ParamInfo(aval=avals[0] if len(avals) == 1 else None, label=_input_label(node),
                                    donated=False))
        elif node.op in ("call_function", "call_method", "call_module"):
            where[node.name] = Output(len(nodes), 0)
            module = module_paths.of_fx_stack(node.meta.get("nn_module_stack"))
            nodes.append(NodeInfo(
                op=node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target)),
                operands=tuple(where[a.name] for a in node.all_input_nodes if a.name in where),
                avals=_avals(node), source=sources.of_stack_trace(node.meta.get("stack_trace") or "", module),
                args=_args_text(node), module=module))
    roots = tuple(where[a.name] for a in gm.graph.output_node().all_input_nodes
                  if isinstance(where.get(a.name), Output))
    return GraphInfo(nodes=tuple(nodes), params=tuple(params), roots=roots)


def _avals(node: torch.fx.Node) -> tuple[str, ...]:
    """The avals of a node's example value (Dynamo's fake tensors); () if not tensors."""
    value = node.meta.get("example_value", node.meta.get("val"))
    values = value if isinstance(value, (list, tuple)) else (value,)
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        return ()
    return tuple(str(Aval(tuple(v.shape), v.dtype)) for v in values)


def _input_label(node: torch.fx.Node) -> str:
    """'L_self_modules_layers_modules_0_modules_lin_parameters_weight_' -> 'layers.0.lin.weight';
    'L_x_' -> 'x'."""
    name = str(node.target)
    if node.op == "placeholder" and name[:2] in ("L_", "G_"):
        parts = name[2:].rstrip("_").replace("_modules_", ".").replace("_parameters_", ".") \
            .replace("_buffers_", ".").split(".")
        return ".".join(parts[1:] if len(parts) > 1 else parts)  # the compiled frame's module is ""
    return name


def _args_text(node: torch.fx.Node, width: int = 160) -> str:
    """Its arguments, operands as $0, $1, ... (as NodeInfo.args)."""
    operands = {n: i for i, n in enumerate(node.all_input_nodes)}

    def text(a):
        if isinstance(a, torch.fx.Node):
            return f"${operands[a]}"
        if isinstance(a, (list, tuple)):
            return "(" + ", ".join(text(x) for x in a) + ")"
        return repr(a)

    shown = ", ".join([text(a) for a in node.args] + [f"{k}={text(v)}" for k, v in node.kwargs.items()])
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def _dynamo_xlakit(fn, args, kwargs, home):
    torch._dynamo.reset()
    f, a, k = _moved(fn, args, kwargs, home)
    with session.capture() as steps, dynamo.compiled_graphs() as graphs:
        torch.compile(f, backend="xlakit")(*a, **k)
    numbers: dict[str, int] = {}  # Dynamo's compile id -> the FX graph's number, in the order captured
    for g in graphs:
        if g.forward:
            numbers.setdefault(g.compile_id, len(numbers))
    why = [f"FX graph {numbers.get(g.compile_id, '?')}{'' if g.forward else ' (backward)'}: {s.op} ({s.node}) "
           f"{s.reason} at {sources.describe(s.source) or '?'} ({s.why})" for g in graphs for s in g.splits]
    return PathReport("Dynamo -> HLO (xlakit backend)", len(steps), sum(len(g.splits) for g in graphs), why), graphs


def _lazy_xlakit(fn, args, kwargs):
    f, a, k = _moved(fn, args, kwargs, DEVICE)
    with session.capture() as records:
        out = f(*a, **k)  # kept alive through the step marker, or nothing is left to compute
        session.mark_step()
        del out
    implicit = [r for r in records if r.trigger not in (Trigger.MARK_STEP, Trigger.SYNC)]
    why = [f"{r.trigger} at {r.source or '?'}" for r in implicit]
    return PathReport("Lazy (xlakit engine)", len(records), len(implicit), why)


# PyTorch's autograd engine counts each kind's devices at its first backward(): a torch_xla
# device made after that fails torch_xla's backward() with an internal assert naming this
_LATE_DEVICE = "device_ready_queues_"
LATE_DEVICE_WHY = ("not run: a backward() ran in this process before torch_xla made its device; import torch_xla "
                   "and call torch_xla.device() before the first backward()")


# explain copies fn (a module), its arguments and the modules and optimizers among them to
# torch_xla's device; what fn reads otherwise (a module it closes over) stays on xlakit's
NOT_MOVED_WHY = ("not run: the function reads a tensor on xlakit's device that explain does not copy to "
                 "torch_xla's (a module or tensor it closes over or reads from a global); pass it as an "
                 "argument to compare torch_xla's paths")


def _torch_xla_with_device():
    """torch_xla with its device made, or None where it is not installed."""
    try:
        torch_xla = _import_torch_xla()
    except ImportError:
        return None
    torch_xla.device()
    return torch_xla


def _torch_xla_paths(fn, args, kwargs, torch_xla) -> list[PathReport]:
    from . import torch_xla as adapter

    reports = []
    for name, compile_fn in (("torch_xla LazyTensor", lambda f: f),
                             ("torch_xla openxla", lambda f: torch.compile(f, backend="openxla"))):
        torch._dynamo.reset()
        f, a, k = _moved(fn, args, kwargs, torch_xla.device())
        before = adapter.execution_count()
        counters = adapter.fallback_counts()
        try:
            out = compile_fn(f)(*a, **k)
        except RuntimeError as e:
            if _LATE_DEVICE in str(e):
                why = LATE_DEVICE_WHY
            elif str(DEVICE) in str(e) and "xla:" in str(e):
                why = NOT_MOVED_WHY
            else:
                raise
            reports.append(PathReport(name, 0, 0, [why]))
            continue
        torch_xla.sync()
        del out
        executions = _increase(before, adapter.execution_count())
        fallbacks = {op: _increase(counters.get(op, 0), n) for op, n in adapter.fallback_counts().items()}
        fallbacks = {op: n for op, n in fallbacks.items() if n}
        why = [f"CPU fallback {op} x{n}" for op, n in sorted(fallbacks.items())]
        if executions > 1:
            why.append(f"{executions - 1} execution(s) before the final one (torch_xla does not say where)")
        reports.append(PathReport(name, executions, max(executions - 1, 0), why))
    return reports


class _NoDefaultDeviceNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Defaulting to PJRT_DEVICE")


def _import_torch_xla():
    """torch_xla, imported for the user's explain() without its notice on the root
    logger ("WARNING:root:Defaulting to PJRT_DEVICE=CPU"), which would also leave
    the root logger printing every library's warnings (logging.basicConfig)."""
    root, notice, placeholder = logging.getLogger(), _NoDefaultDeviceNotice(), logging.NullHandler()
    root.addFilter(notice)
    root.addHandler(placeholder)  # a root logger with a handler is not configured by logging.warning()
    try:
        import torch_xla
    finally:
        root.removeHandler(placeholder)
        root.removeFilter(notice)
    return torch_xla


def _increase(before: int, after: int) -> int:
    """How much a torch_xla counter grew; its openxla path clears counters, so a
    counter below its old value counts from zero."""
    return after - before if after >= before else after
