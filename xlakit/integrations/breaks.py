"""The graph-break explorer: Dynamo's FX breaks next to HLO breaks, per path.

`explain(fn, *args)` RUNS `fn` once per path (Dynamo FX, Dynamo -> xlakit,
lazy xlakit, and torch_xla's LazyTensor and openxla paths when torch_xla is
installed). Modules and tensors are copied for each path, so the caller's
objects are not changed; other side effects of `fn` (printing, globals) happen
once per path.
"""
from __future__ import annotations

import copy
import dataclasses
import logging

import torch
from torch.utils._pytree import tree_map_only

from .. import session
from ..core import sources
from ..core.ir import Frame
from ..core.record import Trigger
from ..front import install
from ..front.recorder import DEVICE
from . import dynamo


@dataclasses.dataclass
class PathReport:
    path: str
    graphs: int                      # FX graphs, or executions per call
    breaks: int                      # FX breaks, HLO splits, or implicit syncs and fallbacks
    why: list[str]                   # where and why, one line each


@dataclasses.dataclass
class BreakReport:
    paths: list[PathReport]
    ops_per_graph: list[list[str]]            # FX ops per Dynamo graph
    partitions: list[dict[str, int]]          # per FX graph: FX node -> executable it went to
    graphs: list = dataclasses.field(default_factory=list)  # per FX graph: GraphInfo, splits marked
    note: str = "explain() ran the function once per path (on copies of its module and inputs)."

    def path(self, name: str) -> PathReport:
        return next(p for p in self.paths if p.path == name)

    def __repr__(self) -> str:
        lines = [self.note, f"{'path':<34} {'graphs':>6} {'breaks':>6}  where and why"]
        for p in self.paths:
            lines.append(f"{p.path:<34} {p.graphs:>6} {p.breaks:>6}  {p.why[0] if p.why else ''}")
            lines += [f"{'':<49}{w}" for w in p.why[1:]]
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"FX graph {i}: {len(ops)} ops: {', '.join(ops[:12])}{' ...' if len(ops) > 12 else ''}")
        return "\n".join(lines)


def explain(fn, *args, **kwargs) -> BreakReport:
    install.install()
    fx, ops = _dynamo_fx(fn, args, kwargs)
    compiled, partitions, graphs = _dynamo_xlakit(fn, args, kwargs)
    paths = [fx, compiled, _lazy_xlakit(fn, args, kwargs)]
    paths += _torch_xla_paths(fn, args, kwargs)
    return BreakReport(paths=paths, ops_per_graph=ops, partitions=partitions, graphs=graphs)


def _moved(fn, args, kwargs, device):
    """Copies of fn (if a module) and of the tensor arguments, on `device`."""
    if isinstance(fn, torch.nn.Module):
        fn = copy.deepcopy(fn).to(device)
    moved = tree_map_only(torch.Tensor, lambda t: t.detach().clone().to(device).requires_grad_(t.requires_grad),
                          (args, kwargs))
    return fn, *moved


def _dynamo_fx(fn, args, kwargs):
    torch._dynamo.reset()
    f, a, k = _moved(fn, args, kwargs, "cpu")
    out = torch._dynamo.explain(f)(*a, **k)
    why = []
    for reason in out.break_reasons:
        frame = reason.user_stack[-1] if reason.user_stack else None
        where = sources.short(Frame(frame.filename, frame.lineno, frame.name)) if frame else "?"
        why.append(f"{where}: {reason.reason.splitlines()[0][:100]}")
    ops = [[getattr(op, "__name__", str(op)) for op in graph_ops] for graph_ops in out.ops_per_graph]
    return PathReport("Dynamo FX", out.graph_count, out.graph_break_count, why), ops


def _dynamo_xlakit(fn, args, kwargs):
    torch._dynamo.reset()
    f, a, k = _moved(fn, args, kwargs, "cpu")
    with session.capture() as steps, dynamo.compiled_graphs() as graphs:
        torch.compile(f, backend="xlakit")(*a, **k)
    why = [f"FX graph {i}: {s.op} ({s.node}) {s.reason} at {sources.describe(s.source) or '?'}"
           for i, g in enumerate(graphs) for s in g.splits]
    return (PathReport("Dynamo -> HLO (xlakit backend)", len(steps), sum(len(g.splits) for g in graphs), why),
            [g.partition for g in graphs], [g.graph for g in graphs])


def _lazy_xlakit(fn, args, kwargs):
    f, a, k = _moved(fn, args, kwargs, DEVICE)
    with session.capture() as records:
        out = f(*a, **k)  # kept alive through the step marker, or nothing is left to compute
        session.mark_step()
        del out
    implicit = [r for r in records if r.trigger not in (Trigger.MARK_STEP, Trigger.SYNC)]
    why = [f"{r.trigger} at {r.source or '?'}" for r in implicit]
    return PathReport("Lazy (xlakit engine)", len(records), len(implicit), why)


def _torch_xla_paths(fn, args, kwargs) -> list[PathReport]:
    try:
        torch_xla = _import_torch_xla()
    except ImportError:
        return []
    from . import torch_xla as adapter

    reports = []
    for name, compile_fn in (("torch_xla LazyTensor", lambda f: f),
                             ("torch_xla openxla", lambda f: torch.compile(f, backend="openxla"))):
        torch._dynamo.reset()
        f, a, k = _moved(fn, args, kwargs, torch_xla.device())
        before = adapter.execution_count()
        counters = adapter.fallback_counts()
        out = compile_fn(f)(*a, **k)
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
