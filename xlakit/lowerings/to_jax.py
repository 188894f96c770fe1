"""Graph -> jax function -> compiled executable.

Each node is traced inside jax.jit through its registered
lowering (registry.py: one JAX function per aten op; the families register
theirs). Which ops become nodes at all, the registry's policies decide at
record time.
"""
from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import torch

from .. import lowerings
from ..core import checks, hlo, sharding, sources
from ..core.ir import Aval, Graph, Node, Slot, digest, fill
from ..core.state import PROCESS
from . import numerics, registry
from .dtypes import jax_dtype
from .verdicts import NeedsEager


def _lowering_source_digest() -> str:
    """The code that lowers graphs (lowerings/ and core/), by content: part of the `flags` key
    component, so an executable an earlier version of it stored on disk is never loaded for a
    graph it now lowers otherwise. A number bumped by hand was forgotten (a `_safe_softmax`
    change went on being served from the cache; a fixed lowering would have stayed wrong)."""
    package = Path(__file__).resolve().parent.parent
    files = sorted(f for part in ("lowerings", "core") for f in (package / part).rglob("*.py"))
    return digest(*(f.relative_to(package).as_posix().encode() + b"\0" + f.read_bytes() for f in files))


LOWERING_VERSION = _lowering_source_digest()


def shape_dtype(aval: Aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, jax_dtype(aval.dtype))


class NodeLoweringError(RuntimeError):
    """One node could not be lowered; `node` says which and where. Unless
    config.strict_lowering is set, the engine then computes it eagerly on CPU.
    `remember`: the op itself is at fault, so later calls run eagerly at once
    (the engine, which handles the error, tells verdicts.remember_failure);
    otherwise only these arguments are (an unsupported dtype, an access that XLA
    would clamp where eager torch raises)."""

    def __init__(self, node: Node, cause: BaseException, *, remember: bool = True):
        where = f" at {sources.describe(node.source)}" if node.source else ""
        super().__init__(f"xlakit could not lower {node.op}{where}: {type(cause).__name__}: {cause}")
        self.node, self.cause, self.remember = node, cause, remember


class NodeFailedError(RuntimeError):
    """A node computed eagerly on CPU raised: eager torch's own error, and where."""

    def __init__(self, node: Node, cause: BaseException):
        where = f" at {sources.describe(node.source)}" if node.source else ""
        super().__init__(f"{node.op}{where}: {type(cause).__name__}: {cause}")
        self.node, self.cause = node, cause

    @staticmethod
    def of(node: Node, cause: BaseException) -> NodeFailedError:
        """The error for `cause`: an IndexError where eager's was one."""
        return (NodeFailedIndexError if isinstance(cause, IndexError) else NodeFailedError)(node, cause)


class NodeFailedIndexError(NodeFailedError, IndexError):
    """A node computed eagerly on CPU raised an IndexError."""


def _as_jax(graph: Graph, donors: tuple[int, ...], trace: checks.Trace | None, out_shardings: tuple,
            watch: numerics.Watch | None, guard: numerics.Guard | None, order, *params):
    """The graph on tracers, its nodes traced in `order` (None: the graph's); its roots, then,
    if its lowerings asked for checks (recorded into `trace`; None: checks are off), one int64
    array of (ok, offending value) per check, then, with a `watch` or a `guard`, its numerics
    vector. A watch with no roots to return (`graph.roots` empty) returns that vector alone."""
    outputs: list = [None] * len(graph.nodes)
    # root j takes donors[j]'s buffer (the plan orders the roots so)
    donated = {root: donor for root, donor in zip(graph.roots, donors)}
    keep = None   # with a guard: whether the donated outputs take their new values
    with checks.collecting(trace):
        for position in range(len(graph.nodes)) if order is None else order:
            node, wires = graph.nodes[position], graph.wiring[position]
            if guard is not None and position == guard.first_update:
                keep = guard.keep(outputs, params)
            operands = [params[w] if w.__class__ is int else outputs[w[0]][w[1]] for w in wires]
            checks.at_node(position)
            # the scope names the node in the HLO's op_name metadata ("jit(_as_jax)/%12 aten.mm.default/dot"),
            # which no key sees: xlakit keys the graph, and JAX's disk cache drops locations
            with jax.named_scope(f"%{position} {node.op}"):
                if node.op is sharding.MARK_SHARDING:
                    results = sharding.constrain(node, operands)
                else:
                    results = _lower_node(node, operands)
                if watch is not None:
                    watch.node(position, wires, operands, results)
            mask = trace.depend(position, wires) if trace is not None else 0
            for i, result in enumerate(results):
                donor = donated.get((position, i)) if mask or keep is not None else None
                if donor is not None:
                    # A donated buffer must not be lost to a step whose check fails (or, with a
                    # guard, to a step the engine searches): an output that takes it holds its old
                    # value then. An elementwise select, fused into the update that computes it;
                    # made here, where the value is made, so that what reads it reads the aliased
                    # buffer: a select on the returned root alone made XLA keep both values (Llama
                    # AdamW step: 78 more copies, +20 MiB). The other choice, checking before
                    # anything is donated, needs a second executable and a host sync per step.
                    ok = trace.all_ok(mask) if mask else None
                    ok = keep if ok is None else ok if keep is None else ok & keep
                    results[i] = jnp.where(ok, result, params[donor])
            outputs[position] = results
    roots = tuple(outputs[n][i] for n, i in graph.roots)
    if out_shardings:
        # as constraints, not jit's out_shardings: the checks' output, known only once
        # traced, is not among them
        roots = tuple(r if s is None else jax.lax.with_sharding_constraint(r, s)
                      for r, s in zip(roots, out_shardings))
    extra = (trace.flags(),) if trace else ()
    if watch is not None:
        extra += (watch.output(),)
    if guard is not None:
        extra += (guard.output(roots, keep),)
    return (*roots, *extra)


# the scope _as_jax names a node by, as it ends up in an instruction's op_name: "jit(_as_jax)/%12 aten.mm.default/dot"
_NODE_SCOPE = re.compile(r"/%(\d+) ")


def hlo_ops(text: str) -> dict[int, tuple[str, ...]]:
    """Node index -> the names of the optimized HLO instructions it became
    (fusions, and the instructions fused into them), read from the node scopes
    in their metadata. Parameters and the bodies of reductions are left out."""
    module = hlo.parse(text)
    reducers = {name for instruction in module.instructions.values() for name in instruction.called("to_apply")}
    found: dict[int, list[str]] = {}
    for computation in module.computations.values():
        if computation.name in reducers:
            continue
        for instruction in computation.instructions:
            scope = None if instruction.opcode == "parameter" else _NODE_SCOPE.search(instruction.op_name or "")
            if scope:
                found.setdefault(int(scope.group(1)), []).append(instruction.name)
    return {index: tuple(names) for index, names in found.items()}


def _lower_node(node: Node, operands: list) -> list:
    """One node on tracers: its lowering, its outputs cast to the dtypes torch's
    meta kernel gave. A wrong shape cannot be mended: the op fails, and runs
    eagerly from then on."""
    fn, found = _traced(node, operands)
    try:
        results, flags = fn(*operands)
    except NeedsEager as e:
        raise NodeLoweringError(node, e, remember=False) from e
    except Exception as e:  # noqa: BLE001 - re-raised with the node that failed
        raise NodeLoweringError(node, e) from e
    checks.adopt(found, flags)
    return list(results)


# (node signature, its lowering, operand types, checks on, torch's default dtype, which some
# lowerings read) -> the node's lowering as an inlined jax.jit.
# A transformer's layers repeat the same nodes: each is traced by its lowering once, later
# ones replay the traced jaxpr (the lowerings' own Python, jnp's argument handling and
# dtype promotion are most of a step's lowering time). Bounded (~9 KB each, measured on
# the Llama step's 206): the oldest go first.
_TRACED: dict = PROCESS.memo("lowerings.to_jax: traced lowerings", 8192,
                             "a repeated node replays its lowering's jaxpr instead of running its Python again")


def evaluate(node: Node, arrays: list) -> list | None:
    """A node's outputs from its lowering alone, on its operands' device `arrays`, outside
    any graph: one dispatch of its traced lowering. None where it cannot be had so (its
    lowering asks for checks, or fails: a sync then computes and reports it)."""
    try:
        fn, _ = _traced(node, arrays)
        results, flags = fn(*arrays)
    except Exception:  # noqa: BLE001 - the step that computes it instead says why
        return None
    return None if flags else list(results)


def _traced(node: Node, operands: list):
    """The node's lowering as a jitted function, and the list its checks are found into."""
    lowering, checking = lowerings.find(node.op), checks.on()
    key = (node.signature, lowering, tuple(o.aval for o in operands), checking, torch.get_default_dtype())
    entry = _TRACED.get(key)
    if entry is None:
        found = [] if checking else None
        fn = jax.jit(functools.partial(_lowered, node.op, lowering, node.template, node.avals, found), inline=True)
        entry = _TRACED[key] = fn, found
    return entry


def _lowered(op, lowering, template, avals, found, *operands):
    """A node's lowering on tracers, and the (ok, offending value) flags of the
    checks it asked for, which go, when traced, into `found` (None: checks off)."""
    for aval in avals:
        if aval is not None and aval.dtype not in lowerings.XLA_DTYPES:
            raise NeedsEager(f"XLA has no {aval.dtype}")
    if lowering.promote:
        operands = _promoted(op, lowering, template, avals, operands)
    own = None if found is None else checks.Trace()
    with checks.collecting(own):
        args, kwargs = fill(template, operands)
        guard = registry.policy(op).guard
        if guard is not None:
            guard(*args, **kwargs)
        result = lowering.fn(*args, **kwargs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    arrays = []
    for value, aval in zip(results, avals):
        if aval is None:
            arrays.append(None)
            continue
        array = jnp.asarray(value)
        if tuple(array.shape) != aval.shape:
            raise ValueError(f"the lowering returned shape {tuple(array.shape)}, torch says {aval.shape}")
        arrays.append(array.astype(jax_dtype(aval.dtype)))
    if not own:
        return arrays, ()
    found[:] = [check for check, _, _ in own.found]
    return arrays, tuple((ok, bad) for _, ok, bad in own.found)


def _promoted(op, lowering, template, avals, operands) -> list:
    """A `promote=True` lowering's operands in the dtype torch computes in; its
    `opmath_scalar` argument, where 0-d in a float16 / bfloat16 computation, in
    float32, as eager's kernel reads it (x * 65536.0 is finite in float16)."""
    out = next((a.dtype for a in avals if a is not None), None)
    dtype = jax_dtype(lowerings.computation_dtype(operands, out))
    kept = None
    if lowering.opmath_scalar and dtype in (jnp.float16, jnp.bfloat16):
        args, kwargs = template
        position = [a.name for a in op._schema.arguments].index(lowering.opmath_scalar)
        value = args[position] if position < len(args) else dict(kwargs).get(lowering.opmath_scalar)
        kept = value.index if isinstance(value, Slot) else None
    return [o.astype(jnp.float32 if i == kept and o.ndim == 0 else dtype) for i, o in enumerate(operands)]


def lower(graph: Graph, donors: tuple[int, ...], matmul_precision: str,
          placement: sharding.Placement | None = None, *, check: bool = True,
          nans: tuple[int, ...] | None = None, ranges: bool = False, guard: bool = False, order=None):
    """Trace and lower to StableHLO; returns jax's Lowered object, the
    checks tracing found (`check=False`: none are computed) and the layout of
    its numerics output (None: it has none; `nans`: the nodes' recording ranks,
    numerics.recording_ranks, to find the first non-finite value; `ranges`:
    each node's absolute maximum; `guard`: whether each output is finite, and
    whether the donated outputs kept their old values: numerics.Guard, whose
    trace order a search of the same step is lowered with, `order`, so that
    both find the same checks). With a placement, for its mesh: GSPMD/Shardy
    propagate the shardings it gives."""
    trace = checks.Trace() if check else None
    watch = numerics.Watch(graph, nans, ranges) if nans is not None or ranges else None
    step_guard = numerics.Guard(graph, donors) if guard else None
    if guard:
        order = step_guard.order
        layout = numerics.Layout(nans=False, ranges=False, guard=True)
    else:
        layout = None if watch is None else watch.layout()
    # keep_unused: every graph input stays an executable parameter, so the
    # executable's signature is exactly the graph's (JAX would prune inputs
    # that only lend their shape, e.g. to zeros_like)
    on_mesh = {} if placement is None else dict(in_shardings=placement.inputs)
    out_shardings = () if placement is None else placement.outputs
    fn = jax.jit(functools.partial(_as_jax, graph, donors, trace, out_shardings, watch, step_guard, order),
                 donate_argnums=donors, keep_unused=True, **on_mesh)
    with jax.default_matmul_precision(matmul_precision):
        lowered = fn.lower(*(shape_dtype(a) for a in graph.param_avals))
    step_checks = trace.found_checks(graph.roots) if trace else checks.StepChecks()
    return lowered, step_checks, layout


# XLA's default lets the compiler drop a rounding between two ops: convert(convert(x, bf16), f32)
# becomes x (its simplify-fp-conversions pass, on CPU and GPU), and a bf16 or f16 step kept
# float32's precision where eager rounds after every op (a bf16 `x + 1e5` gave 20 distinct values
# where eager's rounding gives one). Part of the key through this file's digest (LOWERING_VERSION).
COMPILER_OPTIONS = {"xla_allow_excess_precision": False}


def compile_lowered(lowered):
    """The executable of `lower`'s result, rounded at every op as eager torch rounds."""
    return lowered.compile(compiler_options=COMPILER_OPTIONS)


def matmul_precision() -> str:
    """torch's float32 matmul setting, in JAX's words."""
    with warnings.catch_warnings():  # torch 2.9 nags about its newer TF32 settings
        warnings.simplefilter("ignore")
        setting = torch.get_float32_matmul_precision()
    return {"highest": "highest", "high": "high", "medium": "bfloat16"}[setting]
