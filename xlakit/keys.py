"""The compile-cache key: ordered named components, each a stable digest.

Modelled on JAX's cache_key.get. Source metadata is digested too, but beside
the key, never inside it (pytorch/xla #8538).
"""
from __future__ import annotations

import dataclasses
import marshal
import os
import platform
import re
from functools import lru_cache

from . import sources
from .ir import Graph, digest
from .sharding import MARK_SHARDING_NAME, Placement
from .version import __version__

COMPONENTS = ("graph", "inputs", "donors", "backend", "flags", "shardings")

# XLA flags that only dump or log: they change no compiled code.
_DEBUG_FLAG = re.compile(r"^--xla_(dump|log|debug|hlo_profile|.*_dump_)")


@dataclasses.dataclass(frozen=True)
class Key:
    components: dict[str, str]
    metadata_digest: str
    key: str


def graph_bytes(graph: Graph) -> bytes:
    """Canonical structure: per node its signature and where each operand comes from.

    marshal format 2 serializes bytes, ints and tuples deterministically and
    without back-references (which would depend on object identity).
    """
    return marshal.dumps(([n.signature for n in graph.nodes], graph.wiring, graph.roots), 2)


def metadata_bytes(graph: Graph) -> bytes:
    """Source lines of the nodes and labels of the inputs: shown, never in the key."""
    sources = [str(n.source) if n.source else None for n in graph.nodes]
    return marshal.dumps((sources, [p.label for p in graph.params]), 2)


def compute_key(graph: Graph, donors: tuple[int, ...], flags: dict[str, str],
                placement: Placement | None = None) -> Key:
    """`placement`: where the graph runs on a mesh (sharding.plan); None: on one device."""
    components = {
        "graph": digest(graph_bytes(graph)),
        "inputs": digest(" ".join(map(str, graph.param_avals)).encode()),
        "donors": digest(repr(tuple(sorted(donors))).encode()),
        "backend": _backend_digest(),
        "flags": digest(repr(sorted(flags.items())).encode()),
        "shardings": digest(b"one device" if placement is None else placement.key_bytes(graph)),
    }
    key = digest(*(f"{name}={value}".encode() for name, value in components.items()))
    return Key(components=components, metadata_digest=digest(metadata_bytes(graph)), key=key)


def compile_flags(matmul_precision: str, lowering_version: str, checks: bool) -> dict[str, str]:
    """Settings that change the compiled code; dump and debug flags are left out.
    `checks`: whether the executable computes the in-graph checks (config.checks)."""
    return {"XLA_FLAGS": compiler_xla_flags(), "matmul_precision": matmul_precision,
            "lowering": lowering_version, "checks": "on" if checks else "off"}


def compiler_xla_flags() -> str:
    """XLA_FLAGS without dump, logging and debug flags: the ones that change compiled code."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if not _DEBUG_FLAG.match(f))


@lru_cache(maxsize=1)
def backend_description() -> dict[str, str]:
    import jax
    import jaxlib
    import torch

    device = jax.devices()[0]
    return {
        "python": platform.python_version(),
        "platform": device.platform, "device_kind": device.device_kind,
        "jax": jax.__version__, "jaxlib": jaxlib.__version__,
        "torch": torch.__version__, "xlakit": __version__,
    }


def _backend_digest() -> str:
    return digest(repr(sorted(backend_description().items())).encode())


def diff(new: dict[str, str], old: dict[str, str]) -> list[str]:
    """Names of the components that differ between two keys' components, in key order."""
    return [name for name in COMPONENTS if new[name] != old[name]]


def explain_miss(new: dict[str, str], new_graph, old: dict[str, str], old_graph, limit: int = 3) -> list[str]:
    """Why a key with components `new` is not `old`, in words (graphs are GraphInfo)."""
    lines = []
    changed = diff(new, old)
    if "inputs" in changed:
        lines += _differences("input", [p.aval for p in new_graph.params], [p.aval for p in old_graph.params],
                              limit)
    if "graph" in changed:
        new_nodes = [(n.op, n.avals, n.operands, n.args) for n in new_graph.nodes]
        old_nodes = [(n.op, n.avals, n.operands, n.args) for n in old_graph.nodes]
        for i, (a, b) in enumerate(zip(new_nodes, old_nodes)):
            if a[:3] == b[:3] and a != b:  # a constant argument changed
                node = new_graph.nodes[i]
                lines.append(f"node %{i} {node.op} now ({node.args}){_at(node.source)}, was ({b[3]})")
                break
            if a != b:
                node = new_graph.nodes[i]
                lines.append(f"node %{i} now {node.op} -> {', '.join(node.avals)}{_at(node.source)}, "
                             f"was {b[0]} -> {', '.join(b[1])}")
                break
        for i in range(len(old_nodes), min(len(new_nodes), len(old_nodes) + limit)):
            node = new_graph.nodes[i]
            lines.append(f"new node %{i} {node.op}{_at(node.source)}")
        if len(new_nodes) < len(old_nodes):
            lines.append(f"{len(old_nodes) - len(new_nodes)} fewer nodes ({len(new_nodes)}, was {len(old_nodes)})")
        if not lines:
            lines.append("same nodes, different wiring or outputs")
    if "donors" in changed:
        now = [i for i, p in enumerate(new_graph.params) if p.donated]
        was = [i for i, p in enumerate(old_graph.params) if p.donated]
        lines.append(f"donated inputs now {now}, was {was}")
    if "shardings" in changed and len(new_graph.params) == len(old_graph.params):
        lines += _sharding_differences(new_graph, old_graph, limit, alone=not {"graph", "inputs"} & set(changed))
    lines += [f"{name} changed (compiler, platform or settings)" for name in ("backend", "flags") if name in changed]
    return lines


def _sharding_differences(new_graph, old_graph, limit: int, alone: bool) -> list[str]:
    """Which input's sharding, or which mark_sharding in the graph, changed, from what to what.
    `alone`: nothing but shardings changed, so the same specs mean the mesh or an output differs."""
    lines = [f"input {i}{f' ({a.label})' if a.label else ''} sharding now {a.sharding}, was {b.sharding}"
             for i, (a, b) in enumerate(zip(new_graph.params, old_graph.params)) if a.sharding != b.sharding]
    lines += [f"node %{i} {a.op} now ({a.args}){_at(a.source)}, was ({b.args})"
              for i, (a, b) in enumerate(zip(new_graph.nodes, old_graph.nodes))
              if a.op == b.op == MARK_SHARDING_NAME and a.args != b.args]
    if lines or not alone:
        return lines[:limit]
    return ["the same partition specs: the mesh (shape, axis names or device order) or an output's requested "
            "sharding differs"]


def _differences(what: str, new: list, old: list, limit: int) -> list[str]:
    lines = [f"{what} {i} now {a}, was {b}" for i, (a, b) in enumerate(zip(new, old)) if a != b][:limit]
    if len(new) != len(old):
        lines.append(f"{len(new)} {what}s, was {len(old)}")
    return lines


def _at(source) -> str:
    return f" at {sources.describe(source)}" if source else ""
