"""Graph -> jax function -> compiled executable.

Each node is replayed through torchax's aten implementations (a well-kept
library of ~440 lowerings) on tracers inside jax.jit; we write no lowerings
of our own, only route around the ones known to be wrong.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
import torchax
import torchax.tensor
import warnings

from .ir import Aval, Graph, Node

# Bump when the way graphs are lowered changes: it is part of the `flags` key component.
LOWERING_VERSION = "1"

jax.config.update("jax_enable_x64", True)  # torch has int64/float64; JAX defaults to 32 bits

# torchax lowerings known to be silently wrong (measured on PyTorch's OpInfo
# database); these ops run eagerly on CPU instead.
KNOWN_WRONG = frozenset({
    "aten::embedding_bag", "aten::_embedding_bag", "aten::polygamma", "aten::cauchy",
    "aten::exponential", "aten::normal", "aten::allclose",
})

_TORCH_TO_JAX = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
    torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
}


def jax_dtype(dtype: torch.dtype):
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"xlakit: dtype {dtype} has no XLA equivalent") from None


def shape_dtype(aval: Aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, jax_dtype(aval.dtype))


@functools.cache
def _env() -> torchax.tensor.Environment:
    return torchax.default_env()


def has_lowering(op) -> bool:
    if op.name() in KNOWN_WRONG:
        return False
    try:
        _env()._get_op_or_decomp(op)
    except torchax.tensor.OperatorNotFound:
        return False
    return True


class NodeLoweringError(RuntimeError):
    """torchax could not lower one node; `node` says which and where."""

    def __init__(self, node: Node, cause: BaseException):
        where = f" at {node.source}" if node.source else ""
        super().__init__(
            f"xlakit could not lower {node.op}{where}: {type(cause).__name__}: {cause}. "
            "Rewrite that line with other ops, or move the tensors to CPU for it."
        )
        self.node = node


def _replay(graph: Graph, *arrays):
    env = _env()
    wrap = lambda a: torchax.tensor.Tensor(a, env)  # noqa: E731
    params = [wrap(a) for a in arrays]
    outputs: list[list] = []
    for node, wires in zip(graph.nodes, graph.wiring):
        operands = [params[w] if w.__class__ is int else outputs[w[0]][w[1]] for w in wires]
        args, kwargs = fill(node.template, operands)
        try:
            result = env.dispatch(node.op, (), args, kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised with the node that failed
            raise NodeLoweringError(node, e) from e
        results = result if isinstance(result, (tuple, list)) else (result,)
        # torchax may return JAX's dtypes (int32 indices, promoted scalars):
        # cast to the dtype torch's own meta kernel says the op returns.
        outputs.append([
            wrap(_as_jax(r).astype(jax_dtype(aval.dtype))) if r is not None else None
            for r, aval in zip(results, node.avals)
        ])
    return tuple(outputs[n][i].jax() for n, i in graph.roots)


def _as_jax(value):
    if isinstance(value, torchax.tensor.Tensor):
        return value.jax()
    return jnp.asarray(value)


class Slot:
    """Placeholder in a node's argument template for its i-th tensor operand."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"${self.index}"


def fill(template, values):
    """Rebuild (args, kwargs) from a node template, putting values[i] at Slot(i)."""
    args, kwargs = template
    return [_fill_one(a, values) for a in args], {k: _fill_one(v, values) for k, v in kwargs}


def _fill_one(v, values):
    # Module-level: a recursive closure would be a reference cycle holding `values`.
    if isinstance(v, Slot):
        return values[v.index]
    if isinstance(v, tuple):
        return [_fill_one(x, values) for x in v]
    return v


def lower(graph: Graph, donors: tuple[int, ...], matmul_precision: str):
    """Trace and lower to StableHLO; returns jax's Lowered object."""
    fn = jax.jit(functools.partial(_replay, graph), donate_argnums=donors)
    with jax.default_matmul_precision(matmul_precision):
        return fn.lower(*(shape_dtype(a) for a in graph.param_avals))


def matmul_precision() -> str:
    """torch's float32 matmul setting, in JAX's words."""
    with warnings.catch_warnings():  # torch 2.9 nags about its newer TF32 settings
        warnings.simplefilter("ignore")
        setting = torch.get_float32_matmul_precision()
    return {"highest": "highest", "high": "high", "medium": "bfloat16"}[setting]
