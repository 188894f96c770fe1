"""The host tensors an optimizer advances while a step is recorded, given back when that
step is dropped.

PyTorch's optimizers keep a lazy parameter's step count on the CPU (Adam's `state["step"]`
unless capturable or fused), so it advances at `optimizer.step()`, before the step marker
runs the device's half. When the device then fails (out of memory), or a check fails at an
op recorded before `optimizer.step()` (a bad token id), the engine gives the parameters and
the device state their values from before the step (engine.executor, check_results); this
gives the host state back too, so the next step trains as eager's would after its error,
which stops before the update.
"""
from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..core.ir import recording_mark
from ..engine.executor import current
from .recorder import DEVICE

# per optimizer.step() since the last step marker: its place in the recording order and the
# host tensors of its state with their values before it (a 0-d one's as a Python number); and
# the same for the step that marker ran, given back if that step is dropped
_since_marker: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor | complex]]]] = []
_marked: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor | complex]]]] = []


def _keep_host_state(optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling():  # Dynamo inlines this hook: nothing to trace
        return
    # a 0-d state (a step count) kept as its Python number, exactly (fill_ gives it back): a
    # tensor's clone costs ~1 µs more, 52 a GPT-2 step
    kept = [(value, value.item() if value.dim() == 0 else value.clone())
            for group in optimizer.param_groups for p in group["params"]
            if p.device == DEVICE for value in optimizer.state.get(p, {}).values()
            if isinstance(value, torch.Tensor) and value.is_cpu]
    if kept:
        _since_marker.append((recording_mark(), kept))


def _at_marker() -> None:
    global _since_marker, _marked
    _marked, _since_marker = _since_marker, []


def _give_back(stopped_at: int | None) -> None:
    """The step marker's step was dropped from `stopped_at` on (None: whole): each host tensor
    as it was before the first optimizer.step() recorded after that."""
    given = set()
    with torch.no_grad():
        for mark, kept in _marked:
            for value, before in kept if stopped_at is None or mark > stopped_at else ():
                if id(value) not in given:
                    given.add(id(value))
                    if isinstance(before, torch.Tensor):
                        value.copy_(before)
                    else:
                        value.fill_(before)
    _marked.clear()


def install() -> None:
    register_optimizer_step_pre_hook(_keep_host_state)
    engine = current()
    engine.before_step.append(_at_marker)
    engine.step_dropped.append(_give_back)
