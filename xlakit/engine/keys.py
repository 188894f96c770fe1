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

from ..core.ir import Graph, digest
from ..core.sharding import Placement
from ..version import __version__

COMPONENTS = ("graph", "inputs", "donors", "backend", "flags", "shardings")

# XLA flags that only dump or log: they change no compiled code.
_DEBUG_FLAG = re.compile(r"^--xla_(dump|log|debug|hlo_profile|.*_dump_)")


@dataclasses.dataclass(frozen=True)
class Key:
    components: dict[str, str]
    metadata_digest: str
    key: str
    # the flags' values, so that a miss can name the setting that changed (analysis/misses.py);
    # a class default: a key pickled before it existed loads with none
    settings: tuple = ()


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
    return Key(components=components, metadata_digest=metadata_digest(graph), key=key,
               settings=tuple(sorted(flags.items())))


def metadata_digest(graph: Graph) -> str:
    return digest(metadata_bytes(graph))


def compile_flags(matmul_precision: str, lowering_version: str, checks: bool, *,
                  nans: tuple[int, ...] | None = None, ranges: bool = False) -> dict[str, str]:
    """Settings that change the compiled code; dump and debug flags are left out.
    `checks`: whether the executable computes the in-graph checks (config.checks);
    `nans`: the nodes' recording ranks, where it finds the first non-finite value
    (config.check_nans); `ranges`: whether it records each node's absolute maximum."""
    flags = {"XLA_FLAGS": compiler_xla_flags(), "matmul_precision": matmul_precision,
             "lowering": lowering_version, "checks": "on" if checks else "off"}
    if nans is not None:   # the order is compiled in: the first origin is picked in-graph
        flags["nans"] = "on " + digest(marshal.dumps(nans, 2))
    if ranges:
        flags["ranges"] = "on"
    return flags


@lru_cache(maxsize=1)
def compiler_xla_flags() -> str:
    """XLA_FLAGS without dump, logging and debug flags (the ones that change compiled code), as XLA
    read them: once, when JAX made its backend. A later change compiles nothing differently and
    moves no key (torch_xla's import, e.g. through transformers', appends a flag to the variable)."""
    import jax

    jax.devices()  # the backend, and with it XLA's reading of its flags, made now if not before
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
