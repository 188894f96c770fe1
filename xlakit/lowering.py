"""Graph -> jax function -> compiled executable.

Each node is replayed on tracers inside jax.jit through the op table: torchax's
aten implementations (a well-kept library of ~440 lowerings), or where the
table's policy (ops.py) says so, xlakit's own lowerings, decompositions and
guards, which this module implements.
"""
from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import torch
import torch._decomp

from . import ops, sources
from .ir import Aval, Graph, Node, fill
from .ops import Handling, NeedsEager

# Bump when the way graphs are lowered changes: it is part of the `flags` key component.
LOWERING_VERSION = "2"

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
def torchax():
    """torchax, imported on first use, not with xlakit: its import renames torch's
    privateuse1 backend and sets JAX options, which `import xlakit` must not."""
    import torchax
    import torchax.tensor

    return torchax


@functools.cache
def _env():
    return torchax().default_env()


def _batch_norm_stats_as_on_cpu(op):
    """PyTorch's batch norm decomposition returns, in eval mode on a non-CPU
    device, the running statistics as save_mean / save_invstd (as CUDA does);
    eager CPU, xlakit's reference, returns empty tensors (found by xlakit.opinfo).
    Eval-mode backward reads the running statistics, never these."""
    decomposition = torch._decomp.decomposition_table[op]
    names = [a.name for a in op._schema.arguments]
    if "training" not in names:
        return decomposition
    position = names.index("training")

    def run(*args, **kwargs):
        # (output, save_mean, save_invstd), and the new running statistics in the functional variant
        outputs = decomposition(*args, **kwargs)
        training = args[position] if len(args) > position else kwargs["training"]
        if training:
            return outputs
        empty = outputs[0].new_zeros((0,))
        return (outputs[0], empty, empty, *outputs[3:])
    return run


def _allclose(op):
    """torchax's allclose is wrong (the op table says so), its meta kernel calls .item()
    and torchax has no isclose: torch's isclose, in ops that lower, then one
    read of the bool (a sync, as in eager)."""
    def run(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        if self.dtype != other.dtype:
            raise RuntimeError(f"allclose: expected both inputs to be of the same dtype, "
                               f"got {self.dtype} and {other.dtype}")
        close = self == other
        if equal_nan and (self.is_floating_point() or self.is_complex()):
            close = close | (self.isnan() & other.isnan())
        if rtol != 0 or atol != 0:
            if self.dtype == torch.bool:
                self, other = self.to(torch.get_default_dtype()), other.to(torch.get_default_dtype())
            allowed = (other * rtol).abs() + atol
            actual = (self - other).abs()
            close = close | (actual.isfinite() & (actual <= allowed))
        return bool(torch.ops.aten._local_scalar_dense.default(close.all()))
    return run


def _weight_norm_interface_backward(op):
    """weight_norm's fused backward has no lowering and no meta kernel (found by
    Wav2Vec2's positional convolution: every step fell back to CPU). Eager
    CPU's formula, in aten ops: with s = sum of grad_w * v over all dims but
    `dim`, grad_g = s / norm and grad_v = (g / norm) * (grad_w - v * s / norm^2)."""
    def run(grad_w, saved_v, saved_g, saved_norms, dim):
        dim = dim % saved_v.dim()
        norms = saved_norms.to(saved_g.dtype)
        others = [d for d in range(saved_v.dim()) if d != dim]
        sums = (grad_w * saved_v).sum(others, keepdim=True) if others else grad_w * saved_v
        grad_g = sums / norms
        grad_v = (saved_g / norms) * (grad_w - saved_v * (grad_g / norms))
        return grad_v, grad_g
    return run


# The op table's own decompositions (ops.Handling.OWN_DECOMPOSITION), given the op.
_OWN_DECOMPOSITIONS = {
    "aten::native_batch_norm": _batch_norm_stats_as_on_cpu,
    "aten::_native_batch_norm_legit": _batch_norm_stats_as_on_cpu,
    "aten::_native_batch_norm_legit_functional": _batch_norm_stats_as_on_cpu,
    "aten::allclose": _allclose,
    "aten::_weight_norm_interface_backward": _weight_norm_interface_backward,
}


def decomposition(op):
    """The function the frontend calls instead of recording `op` (the op
    table's policy says which), or None."""
    handling = ops.policy(op).handling
    if handling is Handling.OWN_DECOMPOSITION:
        return _OWN_DECOMPOSITIONS[op_name(op)](op)
    if handling is Handling.DECOMPOSED:
        return torch._decomp.decomposition_table[op]
    return None


def _convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    """torchax has no convolution_backward: differentiate its forward lowering with JAX."""
    env = _env()

    def forward(x, w):
        args = (torchax().tensor.Tensor(x, env), torchax().tensor.Tensor(w, env), None, stride, padding,
                dilation, transposed, output_padding, groups)
        return env.dispatch(torch.ops.aten.convolution.default, (), args, {}).jax()

    _, vjp = jax.vjp(forward, input, weight)
    grad_input, grad_weight = vjp(grad_out)
    grad_bias = grad_out.sum(axis=[d for d in range(grad_out.ndim) if d != 1])
    return tuple(g if wanted else None
                 for g, wanted in zip((grad_input, grad_weight, grad_bias), output_mask))


def _max_pool2d_with_indices_backward(grad_out, input, kernel_size, stride, padding, dilation,
                                      ceil_mode, indices):
    """Scatter-add each gradient to the input position torch recorded in `indices`
    (torchax's lowering of this op gives wrong gradients)."""
    spatial = input.shape[-2] * input.shape[-1]
    planes = grad_out.reshape(-1, grad_out.shape[-2] * grad_out.shape[-1])
    flat_idx = indices.reshape(planes.shape)
    rows = jnp.arange(planes.shape[0])[:, None]
    grad = jnp.zeros((planes.shape[0], spatial), grad_out.dtype).at[rows, flat_idx].add(planes)
    return grad.reshape(input.shape)


def _linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """torchax's lowering returns an unreduced array for a list of dims (found by
    xlakit.opinfo); this is torch's definition."""
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    # dim 0 or -1 of a 0-d tensor is the tensor itself (found by xlakit.opinfo: masked.norm)
    axis = None if not dim or x.ndim == 0 else tuple(d % x.ndim for d in dim)
    magnitude = jnp.abs(x)
    if ord == float("inf"):
        return magnitude.max(axis=axis, keepdims=keepdim)
    if ord == float("-inf"):
        return magnitude.min(axis=axis, keepdims=keepdim)
    if ord == 0:
        return (x != 0).sum(axis=axis, keepdims=keepdim).astype(x.dtype)
    return (magnitude ** ord).sum(axis=axis, keepdims=keepdim) ** (1.0 / ord)


def _pointwise_with_value(combine):
    """addcmul / addcdiv: torchax needs `value` as a Python number, but xlakit
    lifts it to a 0-d input (a new learning rate must not recompile). Computed
    as torch does, in the operands' promoted dtype with `value` cast to it.
    (PyTorch's own decomposition works too, but costs ~50 µs of Python per call
    at record time: most of an AdamW step's tracing.)"""
    def lowering(self, tensor1, tensor2, *, value=1):
        dtype = jnp.result_type(self, tensor1, tensor2)
        value = jnp.asarray(value).astype(dtype)
        return self.astype(dtype) + value * combine(tensor1.astype(dtype), tensor2.astype(dtype))
    return lowering


# The op table's own lowerings (ops.Handling.OWN_LOWERING), on jax arrays.
_OWN_LOWERINGS = {
    "aten::convolution_backward": _convolution_backward,
    "aten::max_pool2d_with_indices_backward": _max_pool2d_with_indices_backward,
    "aten::linalg_vector_norm": _linalg_vector_norm,
    "aten::addcmul": _pointwise_with_value(jnp.multiply),
    "aten::addcdiv": _pointwise_with_value(jnp.divide),
}


def op_name(op) -> str:
    """'aten::norm' for every overload of norm (OpOverload.name() adds the overload)."""
    return op._schema.name


def has_lowering(op) -> bool:
    """Whether a node of `op` lowers: the op table's policy, and for ops it
    leaves to torchax, whether torchax has an implementation."""
    handling = ops.policy(op).handling
    if handling is Handling.OWN_LOWERING:
        return True
    if handling in (Handling.EAGER, Handling.RANDOM, Handling.RANDOM_LIKE):
        return False
    try:
        _env()._get_op_or_decomp(op)
    except torchax().tensor.OperatorNotFound:
        return False
    return True


class NodeLoweringError(RuntimeError):
    """One node could not be lowered; `node` says which and where. Unless
    config.strict_lowering is set, the engine then computes it eagerly on CPU.
    `remember`: the op itself is at fault, so later calls run eagerly at once
    (the engine, which handles the error, tells the op table: ops.remember_failure);
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


def _strided_in_bounds(self, size, stride, storage_offset=None):
    """A lazy tensor owns just its own elements, in row-major order; XLA clamps
    (as_strided) or drops (as_strided_scatter) an access past them, where eager
    torch raises. Such a node runs eagerly, so the user sees torch's error."""
    if any(s == 0 for s in size):
        return
    last = (storage_offset or 0) + sum((s - 1) * st for s, st in zip(size, stride))
    if last >= math.prod(self.shape):
        raise NeedsEager(f"reads element {last} of a tensor of {math.prod(self.shape)}")


# Checks of a node's arguments (torchax tensors) before it is lowered (ops.Policy.guard).
_GUARDS = {
    "aten::as_strided": _strided_in_bounds,
    "aten::as_strided_copy": _strided_in_bounds,
    "aten::as_strided_scatter": lambda self, src, *args, **kwargs: _strided_in_bounds(self, *args, **kwargs),
}


# The op table names what this module implements, no more, no less.
if (set(_OWN_DECOMPOSITIONS) != ops.named(Handling.OWN_DECOMPOSITION)
        or set(_OWN_LOWERINGS) != ops.named(Handling.OWN_LOWERING) or set(_GUARDS) != ops.guarded()):
    raise ImportError("xlakit internal error: lowering.py does not implement what ops.TABLE names")


def _replay(graph: Graph, *arrays):
    env = _env()
    wrap = lambda a: torchax().tensor.Tensor(a, env)  # noqa: E731
    params = [wrap(a) for a in arrays]
    outputs: list[list] = []
    for node, wires in zip(graph.nodes, graph.wiring):
        operands = [params[w] if w.__class__ is int else outputs[w[0]][w[1]] for w in wires]
        args, kwargs = fill(node.template, operands)
        name = op_name(node.op)
        policy = ops.policy(node.op)
        own = _OWN_LOWERINGS[name] if policy.handling is Handling.OWN_LOWERING else None
        try:
            for aval in node.avals:
                if aval is not None and aval.dtype not in _TORCH_TO_JAX:
                    raise NeedsEager(f"XLA has no {aval.dtype}")
            if policy.guard:
                _GUARDS[name](*args, **kwargs)
            if own is not None:
                args, kwargs = env.t2j_iso((args, kwargs))
                result = own(*args, **kwargs)
            else:
                result = env.dispatch(node.op, (), args, kwargs)
        except NeedsEager as e:
            raise NodeLoweringError(node, e, remember=False) from e
        except Exception as e:  # noqa: BLE001 - re-raised with the node that failed
            raise NodeLoweringError(node, e) from e
        results = result if isinstance(result, (tuple, list)) else (result,)
        # torchax may return JAX's dtypes (int32 indices, promoted scalars):
        # cast to the dtype torch's own meta kernel says the op returns. A wrong
        # shape cannot be mended: the op fails, and runs eagerly from then on.
        arrays = [None if aval is None else _as_jax(r) for r, aval in zip(results, node.avals)]
        for array, aval in zip(arrays, node.avals):
            if aval is not None and tuple(array.shape) != aval.shape:
                raise NodeLoweringError(node, ValueError(
                    f"torchax returned shape {tuple(array.shape)}, torch says {aval.shape}"))
        outputs.append([None if a is None else wrap(a.astype(jax_dtype(aval.dtype)))
                        for a, aval in zip(arrays, node.avals)])
    return tuple(outputs[n][i].jax() for n, i in graph.roots)


def _as_jax(value):
    if isinstance(value, torchax().tensor.Tensor):
        return value.jax()
    return jnp.asarray(value)


def lower(graph: Graph, donors: tuple[int, ...], matmul_precision: str):
    """Trace and lower to StableHLO; returns jax's Lowered object."""
    # keep_unused: every graph input stays an executable parameter, so the
    # executable's signature is exactly the graph's (JAX would prune inputs
    # that only lend their shape, e.g. to zeros_like)
    fn = jax.jit(functools.partial(_replay, graph), donate_argnums=donors, keep_unused=True)
    with jax.default_matmul_precision(matmul_precision):
        return fn.lower(*(shape_dtype(a) for a in graph.param_avals))


def matmul_precision() -> str:
    """torch's float32 matmul setting, in JAX's words."""
    with warnings.catch_warnings():  # torch 2.9 nags about its newer TF32 settings
        warnings.simplefilter("ignore")
        setting = torch.get_float32_matmul_precision()
    return {"highest": "highest", "high": "high", "medium": "bfloat16"}[setting]
