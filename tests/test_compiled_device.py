"""torch.compile of models whose parameters live on xlakit's device: Dynamo never
starts a frame in xlakit's code, values equal eager's."""
import collections
import contextlib
import copy
import logging
import os

import pytest
import torch
from conftest import assert_same

import xlakit

_XLAKIT_DIR = os.path.dirname(xlakit.__file__) + os.sep


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class DynamoLog:
    """What Dynamo logged: the files of the frames it started compiling, and every message."""

    def __init__(self):
        self.frames: collections.Counter = collections.Counter()
        self.messages: list[str] = []

    def xlakit_frames(self) -> dict:
        return {file: n for file, n in self.frames.items() if file.startswith(_XLAKIT_DIR)}


class _Handler(logging.Handler):
    def __init__(self, log: DynamoLog):
        super().__init__(logging.DEBUG)
        self.log = log

    def emit(self, record):
        if record.msg.startswith("torchdynamo start compiling"):  # (name, file, line, ...)
            self.log.frames[record.args[1]] += 1
        self.log.messages.append(record.getMessage())


@contextlib.contextmanager
def dynamo_log():
    """Dynamo's log at DEBUG, captured instead of printed."""
    logger = logging.getLogger("torch._dynamo")
    log = DynamoLog()
    level, handlers = logger.level, logger.handlers[:]
    logger.handlers = [_Handler(log)]
    logger.setLevel(logging.DEBUG)
    try:
        yield log
    finally:
        logger.handlers, logger.level = handlers, level


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def test_dynamo_starts_no_frame_in_xlakit_for_a_compiled_forward(dev):
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager).to(dev)
    compiled = torch.compile(model, backend="xlakit")
    x = torch.randn(3, 8)
    with dynamo_log() as log:
        for _ in range(2):
            got = compiled(x.to(dev))
    assert_same(got.detach(), eager(x).detach())
    assert log.xlakit_frames() == {}, log.frames
    assert sum(log.frames.values()) == 1, log.frames  # the model's forward, once
    assert not [m for m in log.messages if "recompile_limit" in m]


def test_dynamo_starts_no_frame_in_xlakit_for_a_compiled_training_step(dev):
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager).to(dev)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (eager, model)]

    def step(model, optimizer, x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    compiled = torch.compile(step, backend="xlakit")
    x, y = torch.randn(3, 8), torch.randn(3, 4)
    with dynamo_log() as log:
        for _ in range(3):
            got = compiled(model, optimizers[1], x.to(dev), y.to(dev))
            want = step(eager, optimizers[0], x, y)
            assert_same(got.detach(), want.detach(), atol=1e-6, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.detach(), q.detach(), atol=1e-6, rtol=1e-5)
    assert log.xlakit_frames() == {}, log.frames
    assert not [m for m in log.messages if "recompile_limit" in m]


def test_compiling_a_module_does_not_warn_about_global_hooks(dev, recwarn):
    model = MLP().to(dev)
    modules = torch.nn.modules.module
    assert not modules._has_any_global_hook()  # xlakit's forward hooks are the modules' own
    assert all(len(m._forward_pre_hooks) == 3 for m in model.modules())
    torch.compile(model, backend="xlakit")(torch.randn(3, 8).to(dev))
    assert not [w for w in recwarn if "global hooks" in str(w.message)]
