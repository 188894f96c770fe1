"""Neural-network ops: convolution, pooling, softmax, normalization, losses,
interpolation, and their backward ops."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import lowers


@lowers("aten::convolution_backward")
def convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    """JAX's vjp of the forward lowering."""
    def forward(x, w):
        return convolution(x, w, None, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(forward, input, weight)
    grad_input, grad_weight = vjp(grad_out)
    grad_bias = grad_out.sum(axis=[d for d in range(grad_out.ndim) if d != 1])
    return tuple(g if wanted else None
                 for g, wanted in zip((grad_input, grad_weight, grad_bias), output_mask))


@lowers("aten::max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(grad_out, input, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    """Scatter-add each gradient to the input position torch recorded in `indices`."""
    spatial = input.shape[-2] * input.shape[-1]
    planes = grad_out.reshape(-1, grad_out.shape[-2] * grad_out.shape[-1])
    flat_idx = indices.reshape(planes.shape)
    rows = jnp.arange(planes.shape[0])[:, None]
    grad = jnp.zeros((planes.shape[0], spatial), grad_out.dtype).at[rows, flat_idx].add(planes)
    return grad.reshape(input.shape)
