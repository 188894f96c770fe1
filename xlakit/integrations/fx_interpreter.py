"""An FX graph run node by node on lazy tensors (its first call, and every call of a graph
that does not become one executable), and what the backend made of it (CompiledGraph):
the executions it forced, each split with its FX node, op, reason and user line, each node's
module path from Dynamo's module stack, and the FX graph as a drawable GraphInfo.
"""
from __future__ import annotations

import dataclasses
import os

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..core import module_paths, sources
from ..core.ir import Aval, Source
from ..core.record import Cache, GraphInfo, NodeInfo, Output, ParamInfo, Trigger
from ..engine.executor import current
from ..front.op_info import op_info
from ..front.recorder import DEVICE, LazyTensor, from_host, unwrap
from ..lowerings import verdicts

@dataclasses.dataclass
class Split:
    """Where an FX graph was cut: an eager fallback or a data-dependent sync."""

    node: str
    op: str
    reason: str                      # the execution's trigger: "fallback", "item"
    source: Source | None
    why: str                         # what kept the node out of the graph's executable, in words


@dataclasses.dataclass
class CompiledGraph:
    """What the backend made of one FX graph."""

    index: int
    fx_nodes: int
    executables: int                 # executions per call
    splits: list[Split]
    partition: dict[str, int]        # FX node name -> executable number it went to
    replays: bool                    # later calls replay one executable
    forward: bool                    # AOTAutograd's forward graph, or the backward of one
    compile_id: str                  # Dynamo's ("1/0"), shared by a forward and its backward
    graph: GraphInfo | None = None   # the FX graph, drawable: inputs, nodes by executable, splits marked


def _to_lazy(t):
    if not isinstance(t, torch.Tensor):
        return t
    if t.device == DEVICE:
        return unwrap(t)
    return from_host(t.detach())


def interpret(gm, inputs, record: CompiledGraph, reason: str):
    """Run the FX graph on lazy tensors. Returns its outputs, the last execution
    (entry, graph), the placeholders' device data, and each output's pending
    value before that execution. `reason`: why Dynamo recompiled, put first in
    the `why` of the execution's record when its executable is new."""
    record.splits.clear()  # a graph traced at every call: its latest trace's splits, not one more copy per call
    lazy_inputs = [_to_lazy(t) for t in inputs]
    placeholder_data = [t._state.data if isinstance(t, LazyTensor) else None for t in lazy_inputs]
    env: dict = {}
    placeholders = iter(lazy_inputs)
    outputs = None
    with current().log.capture() as steps:
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node.name] = next(placeholders)
            elif node.op == "call_function":
                executions_before = len(steps)
                source = _user_line(node)
                env[node.name] = _call(node, env, source)
                if len(steps) > executions_before:  # this node forced an execution: a split
                    record.splits.append(Split(node.name, str(node.target), steps[-1].trigger, source,
                                               _split_why(node, steps[-1].trigger)))
                record.partition[node.name] = len(steps)
            elif node.op == "get_attr":
                env[node.name] = _to_lazy(getattr(gm, node.target))
            elif node.op == "output":
                outputs = torch.fx.node.map_arg(node.args[0], lambda n: env[n.name])
        # only the graph's outputs are the executable's: every intermediate value still
        # alive would be one more output (a GPT-2 forward returned 170, not 1)
        env.clear()
        flat = list(flatten(outputs))
        output_values = [_pending_or_data(o) for o in flat]
        lazy = [o._state for o in flat if isinstance(o, LazyTensor)]
        execution = current().sync(lazy, trigger=Trigger.DYNAMO) if lazy else None
        if reason and execution is not None and steps and steps[-1].cache != Cache.HIT:
            current().log.revise(steps[-1], why=(f"torch.compile recompiled: {reason}", *steps[-1].why))
    record.executables = len(steps)
    record.graph = _fx_graph_info(gm, record)
    return outputs, execution, placeholder_data, output_values


def _split_why(node: torch.fx.Node, trigger: Trigger) -> str:
    """Why an FX node could not join its graph's executable: 'its output's shape depends
    on the data ...', 'runs eagerly on CPU: no XLA lowering'."""
    if trigger == Trigger.ITEM:
        return "reads a tensor's value into Python, so the values before it are computed first"
    if trigger != Trigger.FALLBACK:
        return str(trigger)
    if free_unbacked_symbols(node.meta.get("val")):  # Dynamo's size for it is unknown until it runs
        return "its output's shape depends on the data and XLA compiles static shapes: runs eagerly on CPU"
    info = op_info(node.target)
    if not info.lowerable:
        return f"runs eagerly on CPU: {info.eager_reason}"
    return "runs eagerly on CPU" + (": its XLA lowering failed" if id(node.target) in verdicts.FAILED else "")


def _call(node: torch.fx.Node, env: dict, source: Source | None):
    """One FX node run on lazy tensors. Its own function: operands a loop's variables
    still held at the sync were live tensors, computed as more outputs of the executable."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n.name])
    if node.target is torch.ops.aten._to_copy.default and isinstance(args[0], LazyTensor) \
            and torch.device(kwargs.get("device", DEVICE)).type == "cpu":
        # a copy to the host (`loss.cpu()`) stays on the device, no sync inside the graph: the
        # graph's outputs eager has on the host are returned there (_host_outputs)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory", "non_blocking")}
    with sources.recorded_at(source):
        value = node.target(*args, **kwargs)
    # the graph was traced on host tensors: what its factories make on the host (e.g. the
    # indices of a decomposed resize) moves where the graph runs; a factory on the device
    # makes a user's tensor: its LazyTensor goes on
    return _to_lazy(value) if isinstance(value, torch.Tensor) else value


def _fx_graph_info(gm: torch.fx.GraphModule, record: CompiledGraph) -> GraphInfo:
    """The FX graph as a GraphInfo: each node's `partition` is the executable it went to."""
    split_nodes = {s.node for s in record.splits}
    params, nodes, where = [], [], {}
    for node in gm.graph.nodes:
        avals = _avals(node.meta.get("val"))
        if node.op == "placeholder":
            where[node.name] = len(params)
            params.append(ParamInfo(aval=avals[0] if len(avals) == 1 else None, label=node.name, donated=False))
        elif node.op == "call_function":
            operands = tuple(where[a.name] for a in node.all_input_nodes if a.name in where)
            where[node.name] = Output(len(nodes), 0)
            source = _user_line(node)
            nodes.append(NodeInfo(op=str(node.target), operands=operands, avals=avals, source=source,
                                  module=source.module if source else "", split=node.name in split_nodes,
                                  partition=record.partition.get(node.name, 0)))
    outputs = tuple(where[a.name] for a in gm.graph.output_node().all_input_nodes
                    if isinstance(where.get(a.name), Output))
    return GraphInfo(nodes=tuple(nodes), params=tuple(params), roots=outputs)


def _avals(value) -> tuple[str, ...]:
    """The avals of an FX node's example value (Dynamo's fake tensors); () if unknown."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    if not all(isinstance(v, torch.Tensor) for v in values):
        return ()
    return tuple(str(Aval(tuple(v.shape), v.dtype)) for v in values)


def _user_line(node: torch.fx.Node) -> Source | None:
    """The user and library code an FX node came from, from Dynamo's stack trace
    (none for a torch module's op: its frames are torch's and Dynamo's), and the
    module path it ran in (_module_path)."""
    trace = node.meta.get("stack_trace") or ""
    module = _module_path(node, trace)
    return sources.of_stack_trace(trace, module) or (Source(None, None, module) if module else None)


_OPTIMIZER_FILE = os.path.join("torch", "optim", "")


def _module_path(node: torch.fx.Node, trace: str) -> str:
    """The module path of an FX node as core/module_paths.py names it on the lazy path,
    from Dynamo's module stack: "backward." before a backward node's forward module,
    "optimizer" for an optimizer's step."""
    stack = node.meta.get("nn_module_stack")
    backward = stack is None and node.meta.get("partitioner_tag") == "is_backward"
    if backward:
        stack = node.meta.get("fwd_nn_module_stack")
    if not stack:
        if backward:
            return module_paths.BACKWARD
        return module_paths.OPTIMIZER if _OPTIMIZER_FILE in trace else ""
    path = module_paths.of_fx_stack(stack)
    if backward:
        return f"{module_paths.BACKWARD}.{path}" if path else module_paths.BACKWARD
    return path


def _pending_or_data(o):
    if not isinstance(o, LazyTensor):
        return o
    state = o._state
    return (state.node, state.index, state.aval) if state.node is not None else state.data


def flatten(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from flatten(v)
    else:
        yield value
