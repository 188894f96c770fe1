"""The same step views over the real PyTorch/XLA executor.

`step()` runs torch_xla's step marker (or a partial sync) and builds a
StepRecord from what torch_xla exposes: the pending IR and its graph hash
before the sync, and the deltas of its counters and metrics after it. What
torch_xla does not expose (input shapes of donated buffers, per-component
digests of its key) is None (unknown), never guessed.

torch_xla is optional: `pip install xlakit[torch_xla]`.
"""
from __future__ import annotations

import gc
import os
import re
import time

import torch
from torch._subclasses.fake_tensor import is_fake

from ..core import sources
from ..core.ir import digest
from ..core.record import (
    Backend,
    Cache,
    DonatedBuffer,
    GraphInfo,
    NodeInfo,
    Output,
    ParamInfo,
    StepRecord,
    Timings,
    Trigger,
)
from ..engine.executor import current
from ..engine.keys import compiler_xla_flags

CANNOT_PROFILE = ("xlakit.profile(): torch_xla's executor ran this step, so xlakit cannot run its executable "
                  "again under JAX's profiler: its record has no .profile. torch_xla's own profiler "
                  "(torch_xla.debug.profiler) traces it, without xlakit's join to modules and lines; "
                  "the xlakit backend (the default) profiles the same code")
INSTALL_HINT = ("torch_xla is not installed: pip install 'xlakit[torch_xla]' "
                "(torch_xla 2.9.0 needs torch==2.9.0; set PJRT_DEVICE=CPU, TPU or CUDA)")


def _torch_xla():
    try:
        import torch_xla
        import torch_xla.debug.metrics  # noqa: F401
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return torch_xla


def live_tensors() -> list[torch.Tensor]:
    """Every live tensor on an XLA device, once each, in the order torch_xla's
    step marker takes them (by its tensor id): its graph hash depends on the
    order, and the garbage collector's changes from step to step. torch_xla has
    no API for this, so it walks the garbage collector's objects: fine for a
    notebook view."""
    tensor_id = _torch_xla()._XLAC._xla_get_tensor_id
    # plain tensors only: Dynamo's fake tensors also say they are on "xla"
    live = {tensor_id(o): o for o in gc.get_objects() if type(o) in (torch.Tensor, torch.nn.Parameter)
            and o.device.type == "xla" and not is_fake(o)}
    return [live[i] for i in sorted(live)]


def key_inputs(donor_count: int | str) -> dict[str, str]:
    """What torch_xla 2.9 folds into its compile-cache key besides the graph hash
    (labelled as torch_xla's, not xlakit's components)."""
    flags = compiler_xla_flags()
    return {
        "XLA_FLAGS (no dump flags)": digest(flags.encode()),
        "XLA_IR_DEBUG": os.environ.get("XLA_IR_DEBUG", "unset"),
        "XLA_HLO_DEBUG": os.environ.get("XLA_HLO_DEBUG", "unset"),
        "TPU_MEGACORE": os.environ.get("TPU_MEGACORE", "unset"),
        "donor count": str(donor_count),
    }


def _counters(tx) -> dict[str, float]:
    met = tx.debug.metrics
    values = {name: met.counter_value(name) or 0 for name in met.counter_names()}
    for name in ("CompileTime", "ExecuteTime"):
        data = met.metric_data(name)
        values[f"{name}.count"], values[f"{name}.total_ns"] = (data[0], data[1]) if data else (0, 0.0)
    values["InputOutputAliasCount"] = (met.metric_data("InputOutputAliasCount") or (0, 0.0))[1]
    return values


_IR_LINE = re.compile(r"%(\d+) = (\S+?)(?:\{[^}]*\})? (\S+?)\((.*?)\)(.*)$")


def parse_ir(text: str) -> GraphInfo:
    """torch_xla's IR text -> GraphInfo; device data nodes become inputs."""
    nodes, params, roots, where = [], [], [], {}
    for line in text.splitlines():
        m = _IR_LINE.search(line)
        if not m:
            continue
        number, aval, op, operands, rest = m.groups()
        if op == "xla::device_data":
            where[number] = len(params)
            params.append(ParamInfo(aval=aval, label=None, donated=False))
            continue
        wires = tuple(where[o] for o in re.findall(r"%(\d+)", operands) if o in where)
        where[number] = Output(len(nodes), 0)
        nodes.append(NodeInfo(op=op, operands=wires, avals=(aval,), source=None))
        if "ROOT=" in rest:
            roots.append(Output(len(nodes) - 1, 0))
    return GraphInfo(nodes=tuple(nodes), params=tuple(params), roots=tuple(roots))


def execution_count() -> int:
    """Executions torch_xla has run so far (implicit syncs included). Waits for
    pending executions: torch_xla updates its metrics when they finish."""
    tx = _torch_xla()
    tx.core.xla_model.wait_device_ops()
    return int(_counters(tx).get("ExecuteTime.count", 0))


def fallback_counts() -> dict[str, int]:
    """torch_xla's per-op CPU fallback counters (aten::*) so far."""
    return {k: int(v) for k, v in _counters(_torch_xla()).items() if k.startswith("aten::")}


def step(tensors: list[torch.Tensor] | None = None, trigger: Trigger | str | None = None,
         implicit_executions: int = 0) -> StepRecord | None:
    """torch_xla's step marker (`tensors=None`) or a partial sync of `tensors`,
    described as a StepRecord (None when nothing was pending).
    `implicit_executions`: how many executions ran before it (e.g. in a cell)."""
    tx = _torch_xla()
    pending = tensors if tensors is not None else live_tensors()
    ir_text = tx._XLAC._get_xla_tensors_text(pending) if pending else ""
    graph_hash = tx._XLAC._get_graph_hash(pending) if pending else b""
    graph_hash = graph_hash.hex() if isinstance(graph_hash, bytes) else str(graph_hash)
    before = _counters(tx)
    t0 = time.perf_counter()
    if tensors is None:
        tx.sync()
    else:
        tx._XLAC._xla_sync_multi(tensors, devices=[], wait=True)
    tx.core.xla_model.wait_device_ops()
    wall = time.perf_counter() - t0
    after = _counters(tx)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    if delta.get("ExecuteTime.count", 0) == 0:
        return None
    trigger = Trigger(trigger or (Trigger.MARK_STEP if tensors is None else Trigger.SYNC))
    log = current().log  # the one log, the engine's records beside these
    record = _record(log.next_index, trigger, graph_hash, ir_text, delta, wall, implicit_executions)
    log.append(record)
    if current().profiling is not None:
        sources.warn(CANNOT_PROFILE, sources.capture())
    return record


def _record(index, trigger, graph_hash, ir_text, delta, wall, implicit_executions) -> StepRecord:
    compiled = delta.get("UncachedCompile", 0) > 0
    # torch_xla counts aliased buffers when it compiles: a cache hit's are unknown
    aliased = int(delta.get("InputOutputAliasCount", 0)) if compiled else 0
    graph = parse_ir(ir_text)
    fallbacks = sorted(k for k, v in delta.items() if k.startswith("aten::") and v > 0)
    components = {"graph hash": graph_hash, **key_inputs(aliased if compiled else "unknown")}
    notes = [f"CPU fallback: {name}" for name in fallbacks]
    if implicit_executions:
        notes.append(f"{implicit_executions} implicit execution(s) before the step marker "
                     "(torch_xla does not describe them)")
    return StepRecord(
        index=index, trigger=trigger, key=graph_hash, components=components,
        metadata_digest=None, cache=Cache.MISS if compiled else Cache.HIT,
        donated=tuple(DonatedBuffer(None, None, None, None, None) for _ in range(aliased)),
        num_nodes=len(graph.nodes), num_inputs=len(graph.params), num_outputs=len(graph.roots),
        timings=Timings(compile=delta.get("CompileTime.total_ns", 0) / 1e9,
                        execute=delta.get("ExecuteTime.total_ns", 0) / 1e9 or wall),
        graph=graph, backend=Backend.TORCH_XLA, uses=None, cache_entries=None, hit_rate=None, hlo=None,
        donation_note=("torch_xla counts the buffers it aliases when it compiles, and this step reused "
                       "an executable" if not compiled else
                       "torch_xla reports how many buffers it aliased, not which" if aliased else
                       "torch_xla aliased no buffers"),
        why=tuple(notes),
    )
