"""Dynamo and AOTAutograd fake the lazy device's tensors as they fake torch_xla's.

torch.compile traces a function on fake tensors made by torch's MetaConverter,
which refuses every tensor whose device type is "lazy" (it was written for
TorchScript's lazy tensors: "meta converter nyi"), so a model on xlakit's device
made Dynamo give up on each frame. A user's tensor here is what an XLA tensor
of torch_xla is: a functional wrapper around a tensor without storage, and the
converter's own path for those (a dense meta tensor of the same shape, strides
and dtype, on the tensor's device) applies as it is: only the refusal is skipped.
At run time the compiled graph receives the real tensors, and the backend
(integrations/dynamo.py) runs it on their device buffers.
"""
from __future__ import annotations

import functools

import torch
from torch._subclasses import meta_utils

from .tensor import DEVICE


def install() -> None:
    meta_utils.MetaConverter.__call__ = _fake_lazy(meta_utils.MetaConverter.__call__)


def _fake_lazy(call):
    @functools.wraps(call)
    def wrapper(self, t, shape_env=None, *, callback=None, source=None, symbolic_context=None, trace=True):
        if not (isinstance(t, torch.Tensor) and t.device == DEVICE and torch._is_functional_tensor(t)):
            return call(self, t, shape_env, callback=callback, source=source, symbolic_context=symbolic_context,
                        trace=trace)
        # what __call__ does past its refusal, without the structured trace of the description
        self.hit += 1
        description = self.describer.describe_tensor(t, trace=False)
        with torch._dispatch.python.suspend_functionalization():
            r = self.meta_tensor(description, shape_env, callback or self._identity_callable, source,
                                 symbolic_context)
        if type(t) is torch.nn.Parameter:
            r._is_param = True
        if getattr(t, "_is_buffer", False):  # torch 2.13's nn.Buffer markers
            r._is_buffer = True
            if hasattr(t, "persistent"):
                r.persistent = t.persistent
        return r

    return wrapper
