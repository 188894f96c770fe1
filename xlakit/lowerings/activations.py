"""Activations and their backward ops (part of the pointwise family; pointwise.py
imports this module). Formulas are eager CPU's kernels', as PyTorch's
decompositions state them; float16 / bfloat16 compute in float32."""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .pointwise import as_dtype, clamp_values, is_complex, opmath
from .registry import lowers


@lowers("aten::relu", promote=True)
def relu(self):
    return jnp.maximum(self, jnp.zeros_like(self))  # relu(NaN) is NaN, as clamp_min(0) gives


@lowers("aten::relu6", promote=True)
def relu6(self):
    return clamp_values(self, 0, 6)


@lowers("aten::hardtanh", promote=True, checked_scalars=("min_val", "max_val"))
def hardtanh(self, min_val=-1, max_val=1):
    return clamp_values(self, min_val, max_val)


@lowers("aten::hardtanh_backward", promote=True)
def hardtanh_backward(grad_output, self, min_val, max_val):
    return jnp.where((self <= min_val) | (self >= max_val), jnp.zeros_like(grad_output), grad_output)


@lowers("aten::threshold", promote=True, checked_scalars=("threshold", "value"))
def threshold(self, threshold, value):
    return jnp.where(self <= as_dtype(threshold, self.dtype), as_dtype(value, self.dtype), self)


@lowers("aten::threshold_backward", promote=True)
def threshold_backward(grad_output, self, threshold):
    return jnp.where(self <= as_dtype(threshold, self.dtype), jnp.zeros_like(grad_output), grad_output)


_SQRT1_2 = 0.70710678118654752440
_2_SQRTPI = 1.12837916709551257390


@lowers("aten::gelu", promote=True)
def gelu(self, *, approximate="none"):
    x = opmath(self)
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return x * 0.5 * (1 + lax.erf(x * _SQRT1_2))


@lowers("aten::gelu_backward", promote=True)
def gelu_backward(grad_output, self, *, approximate="none"):
    g, x = opmath(grad_output, self)
    if approximate == "tanh":
        beta = math.sqrt(2) * _2_SQRTPI * 0.5
        kappa = 0.044715
        x_sq = x * x
        tanh_inner = jnp.tanh(beta * (x + kappa * x_sq * x))
        left = 0.5 * x
        right = 1 + tanh_inner
        right_derivative = left * (1 - tanh_inner * tanh_inner) * (beta * (1 + 3 * kappa * x_sq))
        return g * (0.5 * right + right_derivative)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = (_2_SQRTPI * _SQRT1_2 * 0.5) * jnp.exp(x * x * -0.5)
    return g * (cdf + x * pdf)


@lowers("aten::sigmoid", "aten::special_expit", promote=True)
def sigmoid(self):
    x = opmath(self)
    if is_complex(x):
        return 1 / (1 + jnp.exp(-x))
    return lax.logistic(x)


@lowers("aten::sigmoid_backward", promote=True)
def sigmoid_backward(grad_output, output):
    g, y = opmath(grad_output, output)
    if is_complex(y):
        return g * jnp.conj((1 - y) * y)
    return g * (1 - y) * y


@lowers("aten::tanh_backward", promote=True)
def tanh_backward(grad_output, output):
    g, y = opmath(grad_output, output)
    if is_complex(y):
        return g * jnp.conj(1 - y * y)
    return g * (1 - y * y)


@lowers("aten::silu", promote=True)
def silu(self):
    x = opmath(self)
    return x / (1 + jnp.exp(-x))


@lowers("aten::silu_backward", promote=True)
def silu_backward(grad_output, self):
    g, x = opmath(grad_output, self)
    s = 1 / (1 + jnp.exp(-x))
    return g * s * (1 + x * (1 - s))


def _elu(x, alpha, scale, input_scale):
    x = opmath(x)
    negative = jnp.expm1(jnp.minimum(x, 0) * input_scale) * (alpha * scale)
    return jnp.where(x > 0, x * scale, negative)


@lowers("aten::elu", promote=True)
def elu(self, alpha=1, scale=1, input_scale=1):
    return _elu(self, alpha, scale, input_scale)


@lowers("aten::celu", promote=True)
def celu(self, alpha=1.0):
    return _elu(self, alpha, 1.0, 1.0 / alpha)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@lowers("aten::selu", promote=True)
def selu(self):
    return _elu(self, _SELU_ALPHA, _SELU_SCALE, 1.0)


@lowers("aten::elu_backward", promote=True)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    g, x = opmath(grad_output, self_or_result)
    if is_result:
        negative = g * input_scale * (x + alpha * scale)
    else:
        negative = g * input_scale * (alpha * scale) * jnp.exp(x * input_scale)
    return jnp.where(x <= 0, negative, g * scale)


@lowers("aten::leaky_relu", promote=True)
def leaky_relu(self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * as_dtype(negative_slope, self.dtype))


@lowers("aten::leaky_relu_backward", promote=True)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return jnp.where(self > 0, grad_output, grad_output * as_dtype(negative_slope, grad_output.dtype))


@lowers("aten::hardsigmoid", promote=True)
def hardsigmoid(self):
    x = opmath(self)
    return jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@lowers("aten::hardsigmoid_backward", promote=True)
def hardsigmoid_backward(grad_output, self):
    g, x = opmath(grad_output, self)
    return jnp.where((x > -3) & (x < 3), g * (1 / 6), jnp.zeros_like(g))


@lowers("aten::hardswish", promote=True)
def hardswish(self):
    x = opmath(self)
    return x * jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@lowers("aten::hardswish_backward", promote=True)
def hardswish_backward(grad_output, self):
    g, x = opmath(grad_output, self)
    return jnp.where(x <= -3, jnp.zeros_like(g), jnp.where(x < 3, g * (x / 3 + 0.5), g))


@lowers("aten::hardshrink", promote=True)
def hardshrink(self, lambd=0.5):
    return jnp.where((self >= -lambd) & (self <= lambd), jnp.zeros_like(self), self)


@lowers("aten::hardshrink_backward", promote=True)
def hardshrink_backward(grad_out, self, lambd):
    return jnp.where((self >= -lambd) & (self <= lambd), jnp.zeros_like(grad_out), grad_out)


@lowers("aten::softshrink", promote=True)
def softshrink(self, lambd=0.5):
    lam = as_dtype(lambd, self.dtype)
    out = jnp.where(self > lam, self - lam, jnp.where(self < -lam, self + lam, jnp.zeros_like(self)))
    return jnp.where(jnp.isnan(self), self, out)


@lowers("aten::softshrink_backward", promote=True)
def softshrink_backward(grad_output, self, lambd):
    return jnp.where((self >= -lambd) & (self <= lambd), jnp.zeros_like(grad_output), grad_output)


@lowers("aten::softplus", promote=True)
def softplus(self, beta=1, threshold=20):
    x = opmath(self)
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(scaled)) / beta)


@lowers("aten::softplus_backward", promote=True)
def softplus_backward(grad_output, self, beta, threshold):
    g, x = opmath(grad_output, self)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1))


@lowers("aten::mish", promote=True)
def mish(self):
    x = opmath(self)
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


@lowers("aten::mish_backward", promote=True)
def mish_backward(grad_output, self):
    g, x = opmath(grad_output, self)
    tanh_softplus = jnp.tanh(jnp.log1p(jnp.exp(x)))
    s = 1 / (1 + jnp.exp(-x))
    return g * (tanh_softplus + x * s * (1 - tanh_softplus * tanh_softplus))


@lowers("aten::log_sigmoid_forward", promote=True)
def log_sigmoid_forward(self):
    """(output, buffer): eager CPU's buffer is exp(-|x|), as its meta kernel's shape says."""
    x = opmath(self)
    z = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(z), z


@lowers("aten::log_sigmoid_backward", promote=True)
def log_sigmoid_backward(grad_output, self, buffer):
    """The buffer is recomputed: CUDA's is empty, and it may come from either."""
    g, x = opmath(grad_output, self)
    negative = x < 0
    z = jnp.exp(-jnp.abs(x))
    return g * (jnp.where(negative, 1.0, 0.0) - jnp.where(negative, 1.0, -1.0) * (z / (1 + z)))
