"""The host tensors an optimizer advances while a step is recorded, given back when the
device cannot run that step.

PyTorch's optimizers keep a lazy parameter's step count on the CPU (Adam's `state["step"]`
unless capturable or fused), so it advances at `optimizer.step()`, before the step marker
runs the device's half. When the device then fails (out of memory), the engine gives the
parameters and the device state their values from before the step (engine.executor); this
gives the host state back too, so a retry with a smaller batch trains as eager's would after
its out-of-memory error, which stops before the update.
"""
from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..engine.executor import current
from .recorder import DEVICE

# the host tensors of optimizer state, as each was before its first optimizer.step() since the
# last step marker; and the same for the step that marker ran, given back if it fails
_since_marker: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_marked: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _keep_host_state(optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling():  # Dynamo inlines this hook: nothing to trace
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.device != DEVICE:
                continue
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.device.type == "cpu" and id(value) not in _since_marker:
                    _since_marker[id(value)] = (value, value.clone())


def _at_marker() -> None:
    global _since_marker, _marked
    _marked, _since_marker = _since_marker, {}


def _give_back() -> None:
    """The step marker's step failed: its host state as it was before."""
    with torch.no_grad():
        for value, before in _marked.values():
            value.copy_(before)
    _marked.clear()


def install() -> None:
    register_optimizer_step_pre_hook(_keep_host_state)
    engine = current()
    engine.before_step.append(_at_marker)
    engine.step_dropped.append(_give_back)
