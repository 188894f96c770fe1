"""torch.compile backend "xlakit", and the graph-break explorer.

Each FX graph (aten-level, after AOTAutograd, so training works) is run once
through the lazy engine. If it became exactly one executable with no eager
fallback, later calls with the same input shapes, dtypes and Python ints
run that executable directly on the input buffers (a model on the device:
its parameters' buffers, nothing copied), donating the buffers of the inputs
the graph updates in place (engine/compiled.py); the graphs of a training step
(AOTAutograd's forward and backward, then an optimizer's graph fed pending gradients)
are recorded again into the lazy step instead, which the optimizer's graph ends: one
executable per step (_CompiledCall.joins);
random draws (dropout's noise, rand_like) are drawn again at each call by
torch's CPU generator, in the traced order, as the lazy path draws them;
otherwise (ops with no lowering, data-dependent syncs, a draw that is an
eager fallback) it is interpreted lazily on every call, which may split it into
several executables.
Each split is recorded with its FX node, op, reason and user source line, each
node with the module path Dynamo's module stack gives it.
An inference graph (a model under no_grad, an optimizer's step) is called without
AOTAutograd's runtime wrappers where they would only call it and copy the inputs it
updates in: xlakit gives those inputs their new values itself (xlakit_backend).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import weakref

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch._aot_autograd.schemas import SubclassCreationMeta
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..core import module_paths, sharding, sources, transfer
from ..core.ir import Aval, DeviceData, Graph, Source, instantiate, structure
from ..core.record import Cache, GraphInfo, NodeInfo, Output, ParamInfo, Trigger
from ..core.state import PROCESS, Numbering
from ..engine import cache, compiled, keys
from ..engine.executor import current
from ..front import autocast, dynamo_frames, install, labels
from ..front.recorder import DEVICE, LazyTensor, draws_logged, from_host, new_tensor, op_info, unwrap
from ..front.tensor import note_computed
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


# The lists of the `compiled_graphs()` blocks now open; nothing else keeps CompiledGraphs.
_OPEN: list[list[CompiledGraph]] = []
_numbers = PROCESS.keep("integrations.dynamo: graph numbers", Numbering(), bound="one counter",
                        why="CompiledGraph.index, in the order graphs were compiled")
# Compiled calls kept per FX graph (least recently used go first); past them, a call is traced again.
_CALLS_PER_GRAPH = 32
_COMPILED_CALLS: weakref.WeakSet = PROCESS.keep(
    "integrations.dynamo: compiled calls", weakref.WeakSet(),
    bound=f"{_CALLS_PER_GRAPH} per FX graph torch.compile keeps",
    why="a compiled graph's call with a seen input signature runs one executable, not the FX graph",
    clear=lambda: [calls.clear() for calls in list(_COMPILED_CALLS)],
    size=lambda: sum(len(calls) for calls in list(_COMPILED_CALLS)))


# An optimizer's host step counts, each with the device value the last step computed for it:
# the next step reads that value instead of uploading the host tensor again (an upload of the
# step counts per step: ~270 µs of a small model's ~2.5 ms step).
_ON_DEVICE = PROCESS.memo("integrations.dynamo: step counts on the device", 1 << 16,
                          "a host input a compiled step wrote is read by the next step from the device, not uploaded")


@contextlib.contextmanager
def compiled_graphs():
    """`with compiled_graphs() as graphs:` -- the FX graphs the backend compiles
    inside the block, in order (also when it raises); blocks nest."""
    graphs: list[CompiledGraph] = []
    _OPEN.append(graphs)
    try:
        yield graphs
    finally:
        del _OPEN[next(i for i, g in enumerate(_OPEN) if g is graphs)]


class _CompiledCall:
    """One executable run directly on the inputs' buffers at every later call, or its
    graph recorded again into the lazy step (`emit`).

    param_sources: per executable input, a placeholder position, a constant
    DeviceData, or a draw (_Draw); outputs: per FX output, (executable output index, aval), an
    input position (passed through), or None. metadata: the metadata digest of the graph
    traced (its lines and module paths: what its records show). graph: the execution's graph without its
    buffers (core/ir.structure), what `emit` records again. donors: the parameter positions
    of the inputs the graph updates in place -> their placeholder positions; the executable
    that donates their buffers is compiled at its first use (engine/compiled.py).
    draws: every random draw of the traced graph, in the order drawn. to_host: the outputs that
    AOTAutograd copies into a host input (an optimizer's step count): returned on the host,
    so that copy is a host one, not a read of a new device tensor.
    """

    def __init__(self, entry, metadata: str, graph: Graph, placement, param_sources: list, outputs: list,
                 draws: list, donors: dict, to_host: frozenset, updates: bool):
        self.entry, self.metadata, self.graph, self.placement = entry, metadata, graph, placement
        self.param_sources, self.outputs, self.draws = param_sources, outputs, draws
        self.donors, self.to_host, self.updates = donors, to_host, updates
        self.donating = None

    def __call__(self, inputs: list, values: list):
        """`values`: per input, the LiveValue behind it where it is on the device (else None)."""
        engine = current()
        arrays = [a.array for a in self._arguments(inputs, values, engine.read)]
        donated = self._donated(values)
        if donated and self.donating is None:  # (entry, its graph's metadata digest)
            self.donating = (engine.executable_for(self.graph, tuple(sorted(self.donors)), self.placement),
                             keys.metadata_digest(self.graph))
        entry, metadata = self.donating if donated else (self.entry, self.metadata)
        results = compiled.run(engine, entry, arrays, donated, metadata=metadata)
        on_device = any(v is not None for v in values)
        return [out if out is None else inputs[out] if isinstance(out, int)
                else _wrap_output(results[out[0]], out[1], on_device and k not in self.to_host)
                for k, out in enumerate(self.outputs)]

    def joins(self, values: list, *, training: bool, direct: bool) -> bool:
        """Whether this call is recorded into the lazy step (`emit`) rather than run now: a
        training graph's (forward or backward) on the device, and an optimizer step's (an
        inference graph that updates inputs, called by xlakit_backend) whose inputs are still
        pending (a backward's gradients): that step's marker then computes them all at once."""
        if all(v is None for v in values):
            return False
        if training:
            return True
        if not (direct and self.updates):
            return False
        for value in values:
            if value is not None:
                value.resolve()
                if value.node is not None:
                    return True
        return False

    def emit(self, inputs: list, values: list):
        """The graph recorded again into the lazy IR on these inputs (pending ones read as
        they are): its outputs are pending lazy tensors, computed by the next sync, one
        executable with whatever else that sync computes (those wanted on the host too:
        xlakit_backend copies them there after that sync)."""
        operands = self._arguments(inputs, values, lambda value: value.operand())
        nodes = instantiate(self.graph, operands)
        current().recorded_graph(self.graph, operands, nodes)
        outputs = []
        for out in self.outputs:
            if out is None or isinstance(out, int):
                outputs.append(out if out is None else inputs[out])
            else:
                (position, index), aval = self.graph.roots[out[0]], out[1]
                outputs.append(torch._to_functional_tensor(new_tensor(aval, nodes[position], index)))
        return outputs

    def _arguments(self, inputs: list, values: list, of_value) -> list:
        """Per executable input, its device data (or, with `of_value` LiveValue.operand, a pending
        input's (node, output)): the inputs' (`of_value(LiveValue)`), draws drawn again, host
        inputs uploaded, constants as traced."""
        # all draws, in eager's order, also those the executable does not read: the generator
        # then stands where eager's does after the same call
        drawn = dict(zip(map(id, self.draws), transfer.to_device_many([d.draw() for d in self.draws]))) \
            if self.draws else {}
        avals = self.graph.param_avals
        arguments = []
        host = []  # host inputs (an optimizer's step counts), uploaded together
        for k, src in enumerate(self.param_sources):
            if isinstance(src, int):
                if values[src] is None:  # on the host: its value kept on the device, or uploaded below
                    arguments.append(_on_device(inputs[src], avals[k]))
                    if arguments[-1] is None:
                        host.append(k)
                else:
                    arguments.append(of_value(values[src]))
            elif isinstance(src, _Draw):
                arguments.append(DeviceData(drawn[id(src)], avals[k]))
            else:
                arguments.append(src)
        if host:
            # read-only, as the device value kept for a host input is (_keep_on_device): a step that
            # uploads them and the next, which reads them kept, donate alike (one key, one compile)
            for k, array in zip(host, transfer.to_device_many([inputs[self.param_sources[k]] for k in host])):
                arguments[k] = DeviceData(array, avals[k], read_only=True)
        return arguments

    def _donated(self, values: list) -> dict:
        """The buffers to donate at this call: all of the updated inputs', or none when
        one is still read elsewhere (another tensor, pending work, or twice in this call)."""
        if not self.donors or any(values[i] is None for i in self.donors.values()):
            return {}
        buffers = {p: values[i].data for p, i in self.donors.items()}
        fed = [id(v.data) for v in values if v is not None]
        if any(fed.count(id(b)) != 1 for b in buffers.values()) or \
                not compiled.unshared(current(), list(buffers.values())):
            return {}
        return buffers


@dataclasses.dataclass(frozen=True)
class _Draw:
    """A random draw of a traced graph: `draw()` draws it again from torch's CPU generator."""

    draw: object


def _wrap_output(array, aval, on_device: bool):
    if on_device:
        # an op's output, wrapped as functionalization wraps one (not a user's tensor
        # that front/tensor.py's owners track), as _outputs_like does
        return torch._to_functional_tensor(new_tensor(aval, data=DeviceData(array, aval)))
    return transfer.to_host(array, aval.dtype)


def _to_lazy(t):
    if not isinstance(t, torch.Tensor):
        return t
    if t.device == DEVICE:
        return unwrap(t)
    return from_host(t.detach())


def _compile_fx(gm: torch.fx.GraphModule, example_inputs, *, forward: bool, training: bool) -> callable:
    """The function that runs `gm` on xlakit (unboxed: it takes the inputs as arguments).
    `training`: AOTAutograd's forward or backward graph, not an inference graph; those
    join the lazy step (_CompiledCall.joins)."""
    install.install()
    dynamo_frames.mark()  # this module and those imported since Dynamo loaded
    record = CompiledGraph(index=next(_numbers), fx_nodes=sum(n.op == "call_function" for n in gm.graph.nodes),
                           executables=0, splits=[], partition={}, replays=False, forward=forward,
                           compile_id=str(torch._guards.CompileContext.current_compile_id()))
    for graphs in _OPEN:
        graphs.append(record)
    # per input signature, the compiled call; a graph Dynamo made dynamic takes its sizes and ints
    # as inputs, and XLA's executables are static: each new signature is traced again
    calls = cache.ExecutableCache(_CALLS_PER_GRAPH)
    _COMPILED_CALLS.add(calls)
    updated = _updated_inputs() if forward else []
    # the outputs eager has on the host (`loss.cpu()`, a factory with no device, a host input's gradient)
    host = _host_outputs(gm, len(updated), forward)
    reason = _recompile_reason()
    # Dynamo's guards fix the shapes and dtypes of a graph with no symbolic size: one signature
    static = all(isinstance(x, torch.Tensor) and not any(isinstance(d, torch.SymInt) for d in x.shape)
                 for x in example_inputs)

    def run(*inputs, direct: bool = False):
        """`direct`: called by xlakit_backend, which ends the step an optimizer's graph joined."""
        values = [unwrap(t)._state if isinstance(t, torch.Tensor) and t.device == DEVICE else None for t in inputs]
        signature = () if static else _signature(inputs)
        call = calls.get(signature)
        if call is not None and call.joins(values, training=training, direct=direct):
            return _to_host_at(host, call.emit(list(inputs), values))
        _compute_pending(values, tracing=call is None)
        if call is not None:
            return call(list(inputs), values)
        with draws_logged() as draws:
            outputs, execution, placeholder_data, output_values = _interpret(gm, list(inputs), record, reason)
        if execution is not None and record.executables == 1 and not record.splits and None not in draws:
            on_device = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.device == DEVICE]
            call = _plan(*execution, placeholder_data, output_values, [i if i in on_device else None
                                                                         for i in updated], draws,
                           frozenset(k for k, i in enumerate(updated) if i is not None and i not in on_device) | host,
                           any(i is not None for i in updated))
            record.replays = call is not None
            if call is not None:
                calls.put(signature, call)
        return _to_host_at(host, _outputs_like(outputs, inputs))

    return run


def _host_outputs(gm: torch.fx.GraphModule, updates: int, forward: bool) -> frozenset:
    """The positions of the graph's outputs that Dynamo's fake values put on the host: eager
    returns them there. A forward graph's results only (past the `updates` new values of
    updated inputs; not the tensors it saves for its backward, which stay where they are
    computed), a backward graph's gradients."""
    outputs = list(_flatten(gm.graph.output_node().args[0]))
    end = len(outputs)
    if forward:
        meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        if meta is None or meta.tokens:  # effect tokens come first
            return frozenset()
        end = meta.num_forward_returns
    return frozenset(k for k, node in enumerate(outputs[:end]) if k >= updates and isinstance(node, torch.fx.Node)
                     and isinstance(node.meta.get("val"), torch.Tensor) and node.meta["val"].device.type == "cpu")


def _to_host_at(host: frozenset, outputs):
    """`outputs` (a list), those at the positions `host` copied to the host where they are on the device."""
    if not host:
        return outputs
    return [o.cpu() if k in host and isinstance(o, torch.Tensor) and o.device == DEVICE else o
            for k, o in enumerate(outputs)]


def _recompile_reason() -> str:
    """Why Dynamo compiles this frame again ("0/0: tensor 'x' size mismatch at index 0.
    expected 3, actual 4"), or "" for its first compile."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    tx = getattr(torch._dynamo.symbolic_convert.tls, "current_tx", None)
    if compile_id is None or not compile_id.frame_compile_id or tx is None:
        return ""
    failures = torch._dynamo.utils.guard_failures.get(tx.f_code)
    return failures[-1] if failures else ""


def _updated_inputs() -> list[int | None]:
    """Per output AOTAutograd's forward graph returns first, the position of the input
    it is the new value of (AOTAutograd copies it in after the call), or None where
    the update is not only of data (a resize, a new stride): no donation."""
    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    if meta is None or getattr(meta, "tokens", None):  # effect tokens come before the inputs
        return []
    return [i if meta.input_info[i].mutates_data and not meta.input_info[i].mutates_metadata else None
            for i in meta.mutated_inp_runtime_indices]


def _compute_pending(values, *, tracing: bool) -> None:
    """The graph runs on its inputs' device buffers: lazy inputs still pending (a compiled
    forward inside a lazy step, optimizer state made at its first step) are computed
    first. Traced as part of the graph instead, they were computed again, from their old
    inputs, at every call. `values`: per input, its LiveValue or None. Before a trace,
    by a step marker: a partial sync left the rest of the step pending (a buffer a
    forward's graph updated: BatchNorm's statistics), and the next step, which computed it, was
    another program than the steps after it (one more compile of the whole step)."""
    pending = [value for value in values if value is not None]
    for value in pending:
        value.resolve()
    compiled.fill_constants(pending)
    pending = [value for value in pending if value.node is not None]
    if pending or current().has_pending_asserts():  # else the trace would keep checking it
        current().sync(None if tracing else pending, trigger=Trigger.DYNAMO)


def _signature(inputs) -> tuple:
    """What a compiled call's executable was specialized to: each tensor input's shape and
    dtype, each other input's type and value (an int may be a size, a repeat count)."""
    return tuple((t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else (type(t), t) for t in inputs)


def _interpret(gm, inputs, record: CompiledGraph, reason: str):
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
        flat = list(_flatten(outputs))
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


def _plan(entry, graph, placeholder_data, output_values, updated: list, draws: list,
          to_host: frozenset, updates: bool) -> _CompiledCall | None:
    """How to run `entry` on new inputs, or None when an output is not one
    of its results (an input passed through, or a value computed earlier).
    `updated`: per first output, the device input it updates in place (_updated_inputs);
    `draws`: the graph's random draws (front/recorder.py draws_logged); `to_host`: _CompiledCall's;
    `updates`: whether the graph updates any input in place."""
    where = {id(d): i for i, d in enumerate(placeholder_data) if d is not None}
    redrawn = {id(data): _Draw(draw) for data, draw in draws}
    sources = []
    for p in graph.params:
        if id(p) not in where and id(p) not in redrawn:
            p.read_only = True  # a constant the compiled call keeps using
        sources.append(where.get(id(p), redrawn.get(id(p), p)))
    root_of = {(id(graph.nodes[n]), i): k for k, (n, i) in enumerate(graph.roots)}
    outputs = []
    for value in output_values:
        if value is None:
            outputs.append(None)
        elif isinstance(value, tuple) and (id(value[0]), value[1]) in root_of:
            outputs.append((root_of[(id(value[0]), value[1])], value[2]))
        elif isinstance(value, DeviceData) and id(value) in where:
            outputs.append(where[id(value)])  # an input passed through (saved for backward)
        else:
            return None
    parameter_of = {src: p for p, src in enumerate(sources) if isinstance(src, int)}
    donors = {parameter_of[i]: i for i, out in zip(updated, outputs)
              if i is not None and i in parameter_of and isinstance(out, tuple)
              and placeholder_data[i] is not None and out[1] == placeholder_data[i].aval}
    placement = sharding.plan(graph, tuple(sorted(donors))) if donors else None
    return _CompiledCall(entry, keys.metadata_digest(graph), structure(graph), placement, sources, outputs,
                         list(redrawn.values()), donors, to_host, updates)


def _flatten(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


def _outputs_like(outputs, inputs):
    lazy = any(isinstance(t, torch.Tensor) and t.device == DEVICE for t in inputs)

    def convert(o):
        if isinstance(o, LazyTensor):
            return torch._to_functional_tensor(o) if lazy else transfer.to_host(current().read(o._state).array, o.dtype)
        if isinstance(o, (list, tuple)):
            return type(o)(convert(x) for x in o)
        return o

    return convert(outputs)


def _boxed(forward: bool):
    return lambda gm, example_inputs: make_boxed_func(_compile_fx(gm, example_inputs, forward=forward,
                                                                  training=True))


def xlakit_backend(gm: torch.fx.GraphModule, example_inputs):
    """Dynamo's backend "xlakit": AOTAutograd's graphs, each compiled by _compile_fx. An
    inference graph whose AOTAutograd runtime wrappers would only call it and copy the
    new values of the inputs it updates into them (_plain_inference) is called directly,
    as those wrappers call it (grad off), and the inputs take their new values
    (_copy_in): ~10 µs less per call, and an optimizer step's dozens of copy_ less."""
    direct = []

    # the tensors the graph module holds (an optimizer's parameters and state), which
    # AOTAutograd passes before Dynamo's inputs, as aot_module_simplified lists them
    held = (*dict(gm.named_parameters(remove_duplicate=False)).values(),
            *dict(gm.named_buffers(remove_duplicate=False)).values())
    # the positions of the inputs that are gradients (Dynamo's source for them: `<parameter>.grad`)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    gradients = {len(held) + k for k, n in enumerate(placeholders)
                 if getattr(getattr(n.meta.get("grapharg"), "source", None), "member", None) == "grad"}

    def inference(fx, inputs):
        run = _compile_fx(fx, inputs, forward=True, training=False)
        updated = _plain_inference(fx, len(held) + len(example_inputs))
        if updated is not None:
            direct.append((run, updated))
        return make_boxed_func(run)

    with autocast.in_traced_graphs():  # an autocast region inside the graph casts as in eager
        compiled = aot_autograd(fw_compiler=_boxed(True), bw_compiler=_boxed(False),
                                inference_compiler=inference)(gm, example_inputs)
    # inputs in lists reach the graph flattened by AOTAutograd
    if len(direct) != 1 or any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return compiled
    (run, updated), = direct

    @torch._dynamo.disable(reason="xlakit runs the graph")
    def call(*args):
        args = (*held, *args) if held else args
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        amp = torch._C._DisableAutocast() if torch._C._is_any_autocast_enabled() else contextlib.nullcontext()
        try:
            with amp:  # off around the graph, as AOTAutograd's wrapper runs it
                outputs = run(*args, direct=True)
        finally:
            torch._C._set_grad_enabled(grad)
        if not updated:
            return outputs
        on_host = [(args[i], new) for i, new in zip(updated, outputs) if args[i].device != DEVICE]
        for i, new in zip(updated, outputs):
            if args[i].device == DEVICE:
                _copy_in(args[i], new)
        # an optimizer step that joined the lazy step ends it; a graph that updates only gradients
        # (clip_grad_norm_ rescaling them) leaves it to the optimizer's graph that follows
        if any(_pending(args[i]) for i in updated) and not set(updated) <= gradients:
            current().sync(trigger=Trigger.COMPILED, source=sources.user_line())
        for original, new in on_host:  # step counts: computed by that step, read after it
            _copy_in(original, _computed_on_host(new))
            _keep_on_device(original, new)
        return outputs[len(updated):]

    return call


def _computed_on_host(t: torch.Tensor) -> torch.Tensor:
    """A device tensor already computed, on the host: read directly (`.cpu()` would sync,
    and a step ends by reading dozens of step counts)."""
    if t.device != DEVICE:
        return t
    value = unwrap(t)._state
    value.resolve()
    return t if value.data is None else transfer.to_host(value.data.array, value.aval.dtype)


def _keep_on_device(host: torch.Tensor, new: torch.Tensor) -> None:
    """Remember `new`'s device value as the value of `host`, a 0-d host tensor just copied from it."""
    if new.device == DEVICE and host.dim() == 0:
        data = unwrap(new)._state.data
        if data is not None:  # read-only: no step donates it, the next one reads it
            _ON_DEVICE[id(host)] = (weakref.ref(host), repr(host.item()),
                                    DeviceData(data.array, data.aval, read_only=True))


def _on_device(host: torch.Tensor, aval: Aval) -> DeviceData | None:
    """The device value kept for this host tensor, if the host tensor still holds that value:
    compared by value (exactly, as repr tells floats apart), so any way of writing it counts."""
    kept = _ON_DEVICE.get(id(host))
    if kept is None:
        return None
    ref, value, data = kept
    return data if ref() is host and data.aval == aval and repr(host.item()) == value else None


def _pending(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device == DEVICE and unwrap(t)._state.node is not None


def _plain_inference(gm: torch.fx.GraphModule, inputs: int) -> list[int] | None:
    """The positions of the inputs this inference graph updates in place (their new values
    are its first outputs) where AOTAutograd's runtime wrappers would only call it and copy
    those in: it takes Dynamo's `inputs` as they are (none deduplicated, no synthetic base,
    no effect token, no subclass unwrapped), updates only inputs' values (no resize, no new
    strides, no set_), returns no alias, and changes no grad mode. Else None."""
    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    if not (meta is not None and sum(n.op == "placeholder" for n in gm.graph.nodes) == inputs
            and not meta.tokens and meta.num_outputs_aliased == 0
            and meta.num_intermediate_bases == 0 and not meta.dynamic_outputs
            and meta.grad_enabled_mutation is None and not torch._functorch.config.functionalize_rng_ops
            and not any(isinstance(m, SubclassCreationMeta) for m in meta.subclass_inp_meta)):
        return None
    updated = list(meta.mutated_inp_runtime_indices)
    if any(not info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata
           or info.mutation_inductor_storage_resize or info.keep_input_mutations
           for info in (meta.input_info[i] for i in updated)):
        return None
    return updated


def _copy_in(original: torch.Tensor, new: torch.Tensor) -> None:
    """AOTAutograd's copy of an updated input's new value into it. A device tensor of the
    same shape and dtype takes the value itself, laid out as it is, as the copy_ it would
    record does (front/recorder.py's _copy; no op dispatched), its version counted as
    copy_'s is; others are copied as AOTAutograd copies them."""
    if torch._is_functional_tensor(original) and torch._is_functional_tensor(new) and \
            original.shape == new.shape and original.dtype == new.dtype:
        state = unwrap(new)._state
        value = LazyTensor(state, (original.stride(), original.storage_offset()))
        torch._functionalize_replace(original, value)
        torch._functionalize_commit_update(original)
        torch._functionalize_sync(original)
        torch.autograd.graph.increment_version(original)
        if state.data is not None:  # a compiled call's, computed outside a step: named now, as a step's results are
            labels.stamp_if_named(original)
            note_computed(original)
    elif original.requires_grad and original.is_leaf:  # a mutation autograd did not see
        original.detach().copy_(new)
    else:
        original.copy_(new)


def _register() -> None:
    from torch._dynamo import list_backends, register_backend

    if "xlakit" not in list_backends(exclude_tags=()):
        register_backend(name="xlakit")(xlakit_backend)


def _keep_step_counts_on_the_host() -> None:
    """Dynamo moves an optimizer's step counts made on the host to their parameter's device
    before it traces each param group's `_init_group`: with two groups, the first group's
    counts were replaced by device copies after its graph was traced, holding the host ones.
    The graph went on counting in those; the optimizer's state showed 0 forever, and a
    recompile (an LR schedule's new float rate) restarted Adam's bias correction from it: silently
    wrong weights. (On CUDA, Dynamo makes the counts there, capturable; on the CPU the move is
    none.) An optimizer of xlakit's parameters keeps them on the host, where `_init_group` makes them."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    move = OptimizerVariable.move_step_if_cpu
    if getattr(move, "keeps_xlakit_counts", False):
        return

    def move_step_if_cpu(self):
        if not any(p.device == DEVICE for p in self.value.state):
            move(self)

    move_step_if_cpu.keeps_xlakit_counts = True
    OptimizerVariable.move_step_if_cpu = move_step_if_cpu


_register()
_keep_step_counts_on_the_host()
