"""Moving tensor data between host torch tensors and device jax arrays, and between placements."""
from __future__ import annotations

import weakref

import jax
import ml_dtypes
import numpy as np
import torch

from ..config import config
from .ir import FLOAT8, Aval, DeviceData
from .state import PROCESS

# numpy has no bfloat16 or float8 (torch gives no numpy array of them): move their bits as
# unsigned ints and reinterpret them as ml_dtypes' types, which JAX's are.
_BITS = {torch.bfloat16: (torch.uint16, ml_dtypes.bfloat16),
         **{dtype: (torch.uint8, getattr(ml_dtypes, str(dtype).removeprefix("torch."))) for dtype in FLOAT8
            if hasattr(ml_dtypes, str(dtype).removeprefix("torch."))}}


def to_device(t: torch.Tensor) -> jax.Array:
    return jax.device_put(_host_array(t))


# One buffer per shape and dtype of no elements, shared by every upload of one: a transformers
# cache uploads two empty tensors a layer at every call of the model (~0.2 ms each in a step).
_EMPTY: dict[Aval, jax.Array] = PROCESS.memo("core.transfer: empty buffers", 256,
                                              "one device buffer per (shape, dtype) of no elements, shared")


def uploaded(t: torch.Tensor, *, label: str | None = None) -> DeviceData:
    """`t`'s value on the device. An empty one's buffer is shared, so never donated (read-only)."""
    aval = Aval(tuple(t.shape), t.dtype)
    if t.numel():
        return DeviceData(to_device(t), aval, label=label)
    require_dense(t)
    array = _EMPTY.get(aval)
    if array is None:
        array = _EMPTY[aval] = to_device(t)
    return DeviceData(array, aval, label=label, read_only=True)


def _host_array(t: torch.Tensor) -> np.ndarray:
    require_dense(t)
    # A copy, always: JAX's CPU client may alias a host array's memory instead of copying it,
    # and torch tensors are mutable, so an in-place write to `t` after .to(device), copy_()
    # or load_state_dict() changed the device value (an optimizer step on the CPU model
    # moved the device model's weights).
    t = t.detach().clone(memory_format=torch.contiguous_format)
    if t.dtype in _BITS:
        bits, np_dtype = _BITS[t.dtype]
        return t.view(bits).numpy().view(np_dtype)
    return t.numpy()


# The host's own copy of each small integer or bool buffer it uploaded, while the buffer lives:
# a Python read of a value computed from such buffers alone is answered on the host
# (front/host_reads.py, which never reads floats). Buffers are immutable (an in-place write
# makes a new one), so a copy stays that buffer's value.
_HOST_COPIES: weakref.WeakKeyDictionary[DeviceData, torch.Tensor] = weakref.WeakKeyDictionary()


def keep_host_copy(data: DeviceData, t: torch.Tensor) -> None:
    """Keep a copy of `t`, the host tensor `data` was uploaded from, if of an integer or bool
    dtype and small enough (config.host_copy_bytes)."""
    if not (t.dtype.is_floating_point or t.dtype.is_complex) and t.nbytes <= config.host_copy_bytes:
        _HOST_COPIES[data] = t.detach().clone(memory_format=torch.contiguous_format)


def host_copy(data: DeviceData) -> torch.Tensor | None:
    """The host's copy of `data`'s value (keep_host_copy), or None: not kept, or donated since."""
    return None if data.donated else _HOST_COPIES.get(data)


def require_dense(t: torch.Tensor) -> None:
    """XLA holds dense arrays of plain dtypes: say what else a tensor is, and what to do."""
    if t.is_nested:
        what, fix = "a nested tensor", "torch.nested.to_padded_tensor(t, padding) or t.unbind()"
    elif t.is_quantized:
        what, fix = f"a quantized tensor ({t.dtype})", "t.dequantize()"
    elif t.layout != torch.strided:
        what, fix = f"a {str(t.layout).removeprefix('torch.')} tensor", "t.to_dense()"
    else:
        return
    raise NotImplementedError(f"xlakit: {what} cannot move to the lazy device: XLA holds dense arrays. "
                              f"Convert it first: {fix}.")


def to_host(array: jax.Array | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor of `array`'s value: a device array's, or one kept on the host (host_data)."""
    if array.__class__ is not np.ndarray and not array.is_fully_addressable and not array.is_fully_replicated:
        # split over several processes' devices: every process takes part (as it runs the same program)
        from jax.experimental import multihost_utils
        array = multihost_utils.process_allgather(array, tiled=True)
    host = np.array(array)  # a copy: torch must own writable memory
    if dtype in _BITS:
        bits, _ = _BITS[dtype]
        return torch.from_numpy(host.view(f"u{bits.itemsize}")).view(dtype)
    return torch.from_numpy(host).to(dtype)


def place(array: jax.Array | np.ndarray, sharding) -> jax.Array:
    """`array`'s value with `sharding` (JAX moves it). Across processes, device
    data one process holds (made from host data, which is the same in each
    process of one program), and data kept on the host (host_data), is laid out from that host copy."""
    on_host = array.__class__ is np.ndarray
    if sharding.is_fully_addressable or not on_host and not array.is_fully_addressable:
        return jax.device_put(array, sharding)
    host = array if on_host else np.asarray(array)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


class HostCopy:
    """A device array's shards copied to host memory, to put back where they were
    (the buffers an executable's first run is given: engine.executor keeps them)."""

    __slots__ = ("shape", "sharding", "shards")

    def __init__(self, array: jax.Array):
        self.shape, self.sharding = array.shape, array.sharding
        self.shards = [(s.device, np.array(s.data)) for s in array.addressable_shards]  # copies, not views

    def to_device(self) -> jax.Array:
        return jax.make_array_from_single_device_arrays(
            self.shape, self.sharding, [jax.device_put(host, device) for device, host in self.shards])


_SCALARS: dict[tuple, DeviceData] = PROCESS.memo(
    "core.transfer: lifted scalars", 4096, "one 0-d input per (value, dtype), shared by the nodes that lift it")


def scalar_key(value):
    """A Python number as a key, exactly: -0.0 apart from 0.0 (1 / x tells them apart), every nan
    one key. Its repr says the same, at ~0.5 µs a call where this costs ~0.07 (a replayed step
    compares or lifts a float at most of its ops)."""
    if value.__class__ is float and value and value == value:
        return value
    return repr(value)


def lifted_scalar(value: float, dtype: torch.dtype) -> DeviceData:
    """A Python scalar as a read-only 0-d input of the graph: its value is data, not
    part of the key, so a learning rate or a bias correction that changes every step
    runs the same executable. Its array stays on the host (0-d numpy), moved by the call of
    the executable that reads it with that call's other arguments: a device_put of its own
    cost 90-380 µs right after an execution on JAX's CPU client (28 µs otherwise), and an
    AdamW step's two new bias corrections 0.7 ms of a Llama step (bench/RESULTS.md)."""
    key = (scalar_key(value), dtype)
    data = _SCALARS.get(key)
    if data is None:
        host = torch.tensor(value, dtype=dtype)
        data = _SCALARS[key] = host_data(host, label="scalar")
        keep_host_copy(data, host)
    return data


def host_data(t: torch.Tensor, *, label: str | None = None) -> DeviceData:
    """`t`'s value as a read-only input kept on the host (a numpy array): the call of the
    executable that reads it moves it with its other arguments (see lifted_scalar)."""
    return DeviceData(_host_array(t), Aval(tuple(t.shape), t.dtype), label=label, read_only=True)
