"""Python scalar arguments checked as eager's kernels check them: a value that does not fit
the type eager converts it to raises eager's overflow error, with the user's line.
"""
from __future__ import annotations

import functools
import math
import re

import torch
from torch._prims_common import get_computation_dtype

from ..core import sources
from ..core.ir import Aval
from .op_info import OpInfo

aten = torch.ops.aten


@functools.cache
def _c10_name(dtype: torch.dtype) -> str:
    """c10's name of dtype in eager's overflow message (`at::Half` in torch 2.9, `c10::Half` in
    2.13): asked of eager, which checks a fill of two elements."""
    probe = 1e300 if dtype.is_floating_point or dtype.is_complex else 2 ** 62
    try:
        torch.full((2,), probe, dtype=dtype)
    except RuntimeError as e:
        found = re.search(r"to type (.+) without overflow", str(e))
        if found:
            return found.group(1)
    return str(dtype)


def given(info: OpInfo, args, kwargs) -> tuple:
    """The Scalar arguments eager checks (registry.Policy.checked_scalars) that this call passes
    as Python numbers, as (name, value) pairs: most calls pass none (add's alpha left out), and
    a replayed op then needs no check (~1 µs of a replayed add, bench/tracing.py)."""
    found = ()
    for position, name in info.checked_scalars:
        value = args[position] if position < len(args) else kwargs.get(name)
        if isinstance(value, (int, float, complex)):
            found += ((name, value),)
    return found


def check(func, info: OpInfo, scalars: tuple, aval: Aval) -> None:
    """Raise eager's error where a Scalar argument (`scalars`: what `given` found) does not fit
    the type eager's kernel converts it to: XLA would wrap it or make it inf. The value is a
    Python constant, so this needs no sync."""
    for name, value in scalars:
        dtype = aval.dtype
        if info.opmath_scalar == name:
            dtype = get_computation_dtype(dtype)  # float32 for float16 / bfloat16
        elif func._overloadpacket is aten.pow and dtype in (torch.float32, torch.float64):
            continue  # pow's float kernels read the exponent in double
        if info.fill and dtype in (torch.float16, torch.bfloat16) and math.prod(aval.shape) == 1:
            continue
        if _overflows(value, dtype):
            where = sources.describe(sources.capture())
            raise RuntimeError(
                f"{func}: value cannot be converted to type {_c10_name(dtype)} without overflow: "
                f"{name}={value!r} does not fit {dtype}" + (f" (at {where})" if where else "")
                + ". Pass a value in the tensor's range, or cast the tensor to a wider dtype first.")


def _overflows(value, dtype: torch.dtype) -> bool:
    """c10's `overflows<To, From>`, as checked_convert asks it: ints compare exactly, floats
    as doubles; infinities fit a float type, NaN and infinities no integer type; an
    unsigned type takes negative ints down to -max (they wrap); a complex value fits a
    real type only with a zero imaginary part."""
    if dtype is torch.bool or isinstance(value, bool):
        return False
    if dtype.is_complex:
        limit = torch.finfo(dtype).max
        return any(math.isfinite(part) and abs(part) > limit for part in (value.real, value.imag))
    if isinstance(value, complex):
        if value.imag != 0:
            return True
        value = value.real
    if dtype.is_floating_point:
        return math.isfinite(value) and abs(float(value)) > torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    if isinstance(value, float):
        return not math.isfinite(value) or value < float(info.min) or value > float(info.max)
    lowest = -info.max if info.min == 0 else info.min
    return value < lowest or value > info.max
