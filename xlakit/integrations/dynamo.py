"""torch.compile backend "xlakit", and the graph-break explorer.

Each FX graph (aten-level, after AOTAutograd, so training works) is run once
through the lazy engine. If it became exactly one executable with no eager
fallback, later calls with the same input shapes, dtypes and Python ints
run that executable directly on the input buffers (a model on the device:
its parameters' buffers, nothing copied), donating the buffers of the inputs
the graph updates in place (compiled_call.py, engine/compiled.py); the graphs of a training step
(AOTAutograd's forward and backward, then an optimizer's graph fed pending gradients)
are recorded again into the lazy step instead, which the optimizer's graph ends: one
executable per step (compiled_call.CompiledCall.joins);
the backward of a training graph recomputes its forward rather than being handed its
activations (_recomputing_partition: XLA merges the two in the step's executable);
random draws (dropout's noise, rand_like) are drawn again at each call by
torch's CPU generator, in the traced order, as the lazy path draws them;
otherwise (ops with no lowering, data-dependent syncs, a draw that is an
eager fallback) it is interpreted lazily on every call, which may split it into
several executables (fx_interpreter.py).
Each split is recorded with its FX node, op, reason and user source line, each
node with the module path Dynamo's module stack gives it.
An inference graph (a model under no_grad, an optimizer's step) is called without
AOTAutograd's runtime wrappers where they would only call it and copy the inputs it
updates in: xlakit gives those inputs their new values itself (xlakit_backend).
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput, MetadataMutationAOTOutput
from torch._functorch._aot_autograd.schemas import SubclassCreationMeta
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

from ..core import sources, transfer
from ..core.record import Trigger
from ..core.state import PROCESS, Numbering
from ..engine import cache, compiled
from ..engine.executor import current
from ..front import autocast, dynamo_frames, install, labels
from ..front.recorder import DEVICE, LazyTensor, draws_logged, unwrap
from ..front.tensor import lazy_tensor, note_computed
from . import compiled_call, fx_interpreter
from .fx_interpreter import CompiledGraph


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


def _compile_fx(gm: torch.fx.GraphModule, example_inputs, *, forward: bool, training: bool) -> callable:
    """The function that runs `gm` on xlakit (unboxed: it takes the inputs as arguments).
    `training`: AOTAutograd's forward or backward graph, not an inference graph; those
    join the lazy step (compiled_call.CompiledCall.joins)."""
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

    def run(*inputs, direct: bool = False, bare: frozenset = frozenset(), copied_into: tuple = ()):
        """`direct`: called by xlakit_backend, which ends the step an optimizer's graph joined;
        `bare`: the outputs it takes as they are, copied into device inputs or read for host step counts
        at once (CompiledCall.emit's); `copied_into`: per first output, the position of the input it is
        copied into, where that input may take the new value itself (CompiledCall.emit's `into`), else None."""
        lazies = [lazy_tensor(t) for t in inputs]
        values = [None if t is None else t._state for t in lazies]
        signature = () if static else compiled_call.signature(inputs)
        call = calls.get(signature)
        if call is not None and call.joins(values, training=training, direct=direct):
            into = {k: lazies[i] for k, i in enumerate(copied_into) if i is not None}
            return _to_host_at(host, call.emit(list(inputs), values, bare, into))
        _compute_pending(values, tracing=call is None)
        if call is not None:
            return call(list(inputs), values)
        with draws_logged() as draws:
            outputs, execution, placeholder_data, output_values = fx_interpreter.interpret(gm, list(inputs), record,
                                                                                           reason)
        if execution is not None and record.executables == 1 and not record.splits and None not in draws:
            on_device = [i for i, t in enumerate(inputs) if _on_lazy_device(t)]
            call = compiled_call.plan(*execution, placeholder_data, output_values, [i if i in on_device else None
                                                                                    for i in updated], draws,
                                      frozenset(k for k, i in enumerate(updated)
                                                if i is not None and i not in on_device) | host,
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
    outputs = list(fx_interpreter.flatten(gm.graph.output_node().args[0]))
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


def _outputs_like(outputs, inputs):
    lazy = any(_on_lazy_device(t) for t in inputs)

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
            direct.append((run, updated, _HostPart.of(fx, inputs, updated)))
        return make_boxed_func(run)

    joined = any(_on_lazy_device(x) for x in (*held, *example_inputs))
    with autocast.in_traced_graphs():  # an autocast region inside the graph casts as in eager
        compiled = aot_autograd(fw_compiler=_boxed(True), bw_compiler=_boxed(False), inference_compiler=inference,
                                partition_fn=_recomputing_partition if joined else default_partition)(gm, example_inputs)
    # inputs in lists reach the graph flattened by AOTAutograd
    if len(direct) != 1 or any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return compiled
    (run, updated, host_part), = direct
    bare = frozenset(range(len(updated)))  # every updated input's new value: copied in or read here

    @torch._dynamo.disable(reason="xlakit runs the graph")
    def call(*args):
        args = (*held, *args) if held else args
        on_device = [args[i].device == DEVICE for i in updated]
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        amp = torch._C._DisableAutocast() if torch._C._is_any_autocast_enabled() else contextlib.nullcontext()
        # a device input updated through its functional wrapper takes its new value itself (_copy_in)
        copied_into = tuple(i if device and torch._is_functional_tensor(args[i]) else None
                            for i, device in zip(updated, on_device))
        try:
            with amp:  # off around the graph, as AOTAutograd's wrapper runs it
                outputs = run(*args, direct=True, bare=bare, copied_into=copied_into)
        finally:
            torch._C._set_grad_enabled(grad)
        if not updated:
            return outputs
        on_host = [(args[i], new) for i, new, device in zip(updated, outputs, on_device) if not device]
        for i, new, device in zip(updated, outputs, on_device):
            if device:
                _copy_in(args[i], new)
        # an optimizer step that joined the lazy step ends it; a graph that updates only gradients
        # (clip_grad_norm_ rescaling them) leaves it to the optimizer's graph that follows
        if any(_pending(args[i]) for i in updated) and not set(updated) <= gradients:
            current().mark_step(trigger=Trigger.COMPILED, source=sources.user_line())
        # step counts: computed on the host from host inputs, as eager computes them (all of them
        # before any is written): no read of the step's result, which waited for a step dispatched
        # ahead; else read from it
        counted = host_part(args, on_device) if host_part is not None and on_host else None
        for k, (original, new) in enumerate(on_host):
            _copy_in(original, counted[k] if counted is not None else _computed_on_host(new))
        return outputs[len(updated):]

    return call


class _HostPart:
    """The new values of an inference graph's updated host inputs (an optimizer's step counts),
    computed by torch on the host from host inputs alone, as eager computes them, at every step:
    reading them from the step's result was a device read per count, and for a step dispatched
    ahead (`config.wait_for_execution = False`) a wait for its whole executable.
    `of` gives None where one of those values reads a device tensor or draws."""

    def __init__(self, positions: list[int], reads: list[int], graph: torch.fx.Graph):
        self.positions = positions  # the updated inputs' positions among the graph's first outputs
        self.reads = reads          # the graph's inputs it reads
        self.graph = graph
        self.module = None          # made at the first call: its constants are real tensors, not fake ones

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, inputs, updated: list[int]) -> _HostPart | None:
        positions = [k for k, i in enumerate(updated) if not _on_lazy_device(inputs[i])]
        outputs = list(fx_interpreter.flatten(gm.graph.output_node().args[0]))
        wanted = [outputs[k] for k in positions]
        if not wanted or not all(isinstance(node, torch.fx.Node) for node in wanted):
            return None
        needed, stack = set(), list(wanted)
        while stack:
            node = stack.pop()
            if node in needed:
                continue
            value = node.meta.get("val")
            if node.op not in ("placeholder", "call_function") or _on_lazy_device(value) \
                    or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
                return None
            needed.add(node)
            stack.extend(node.all_input_nodes)
        placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
        graph, made = torch.fx.Graph(), {}
        for node in gm.graph.nodes:
            if node in needed:
                made[node] = graph.node_copy(node, made.__getitem__)
        graph.output([made[node] for node in wanted])
        return cls(positions, [k for k, node in enumerate(placeholders) if node in needed], graph)

    def __call__(self, args, on_device: list[bool]) -> list[torch.Tensor] | None:
        """Per updated host input, its new value; None if the inputs are not where they were traced."""
        if [k for k, device in enumerate(on_device) if not device] != self.positions:
            return None
        if self.module is None:
            self.module = _constants_made_once(self.graph)
        return self.module(*[args[i] for i in self.reads])


def _constants_made_once(graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """`graph` as a module whose ops that read nothing (AdamW's `1`, a scalar_tensor for each step
    count) are made once, as its attributes, not at each call: 39 counts' part 0.62 -> 0.44 ms a step.
    By hand: torch.fx's const_fold keeps them in a ParameterList, whose indexing cost each as much."""
    constants = {}
    for node in list(graph.nodes):
        if node.op == "call_function" and not node.all_input_nodes:
            name = f"constant{len(constants)}"
            constants[name] = node.target(*node.args, **node.kwargs)
            with graph.inserting_before(node):
                node.replace_all_uses_with(graph.get_attr(name))
            graph.erase_node(node)
    return torch.fx.GraphModule(constants, graph)


def _on_lazy_device(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device == DEVICE


def _recomputing_partition(joint: torch.fx.GraphModule, joint_inputs, **kwargs):
    """AOTAutograd's split of a training graph into forward and backward, the backward saving
    nothing but the graph's inputs and recomputing the rest. On the device both graphs join one
    lazy step (compiled_call.CompiledCall.joins), so XLA's common-subexpression pass merges each
    recomputed op with the forward's own: the step's FLOPs, bytes and peak memory stay those of
    the default split (bench/RESULTS.md), while the forward returns no saved activations, each of
    which was a tensor made, registered and handed to autograd at every call (a compiled Llama
    step makes 275 tensors, not 403). A graph with a random op keeps the default split: recomputed, its draw
    would be another than the forward's; so does a graph that updates an input (BatchNorm's running
    statistics): the backward would recompute from the updated value, and autograd refuses a saved
    input whose version moved. What it costs: a backward run in another step than its forward (a
    step marker between them) computes the forward again; a graph on the host, run as executables of
    its own, keeps the default split (xlakit_backend)."""
    # what each output of the joint graph is (AOTAutograd's descriptors): an updated input's new value among them?
    outputs = joint.graph.output_node().meta.get("desc")
    if outputs is None or any(isinstance(d, (InputMutationAOTOutput, MetadataMutationAOTOutput)) for d in outputs) \
            or any(torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()) for node in joint.graph.nodes):
        return default_partition(joint, joint_inputs, **kwargs)
    with torch._functorch.config.patch(activation_memory_budget=0.0):  # 0: save the inputs alone
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)


def _computed_on_host(t: torch.Tensor) -> torch.Tensor:
    """A device tensor already computed, on the host: read directly (`.cpu()` would sync)."""
    if t.device != DEVICE:
        return t
    value = unwrap(t)._state
    value.resolve()
    return t if value.data is None else transfer.to_host(value.data.array, value.aval.dtype)


def _pending(t) -> bool:
    return _on_lazy_device(t) and unwrap(t)._state.node is not None


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
    copy_'s is; others are copied as AOTAutograd copies them. `new`: the graph's output, used
    once: bare (CompiledCall.emit) where the call joined the step, else functional; its
    LazyTensor becomes the input's own where it is laid out as the input is (~4 µs less a copy
    than wrapping, unwrapping and making another: an optimizer step copies in ~3 per parameter),
    or is the input's own already (CompiledCall.emit's `into`: no tensor made; a compiled Llama step
    0.5 ms less)."""
    bare = new.__class__ is LazyTensor
    if torch._is_functional_tensor(original) and (bare or torch._is_functional_tensor(new)) and \
            original.shape == new.shape and original.dtype == new.dtype:
        value = new if bare else unwrap(new)
        state, layout = value._state, (original.stride(), original.storage_offset())
        if (value.stride(), value.storage_offset()) != layout:
            value = LazyTensor(state, layout)
        torch._functionalize_replace(original, value)
        torch._functionalize_commit_update(original)
        torch._functionalize_sync(original)
        torch.autograd.graph.increment_version(original)
        if state.data is not None:  # a compiled call's, computed outside a step: named now, as a step's results are
            labels.stamp_if_named(original)
            note_computed(original)
        return
    if bare:
        new = torch._to_functional_tensor(new)
    if original.requires_grad and original.is_leaf:  # a mutation autograd did not see
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
