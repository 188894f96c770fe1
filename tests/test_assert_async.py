"""torch._assert_async as an in-graph check: a passing one costs no execution of its
own and no fallback; a failing one raises eager's error, with the op and the line, at
the read after it, and the session goes on (lowerings/asserts.py)."""
import inspect

import pytest
import torch
from conftest import assert_same
from test_compiled_device import _failures, dynamo_log, fresh_dynamo  # noqa: F401

import xlakit
from xlakit.engine.values import StepFailedError


def _eager_error(*args) -> str:
    """Eager CPU's message for torch._assert_async(*args)."""
    with pytest.raises(RuntimeError) as raised:
        torch._assert_async(*args)
    return str(raised.value)


def _next_line() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


def _ops() -> list[str]:
    return [n.op for n in xlakit.last_step().graph.nodes]


@pytest.mark.parametrize("message", [(), ("the sum must be positive",)])
def test_a_passing_assert_joins_the_step_that_reads_a_value(dev, message):
    x = torch.arange(4.0, device=dev)
    torch._assert_async(x.sum() > 0, *message)
    assert_same(x * 2, torch.arange(4.0) * 2)
    assert xlakit.metrics()["executions"] == 1 and xlakit.metrics()["fallbacks"] == 0
    assert ("aten._assert_async.msg" if message else "aten._assert_async.default") in _ops()


def test_a_pending_assert_is_computed_by_a_step_marker_and_by_a_read_of_a_computed_value(dev):
    x = torch.arange(4.0, device=dev) + 1
    xlakit.mark_step()
    torch._assert_async(x.min() > 0)
    xlakit.mark_step()
    assert "aten._assert_async.default" in _ops()
    line = _next_line()
    torch._assert_async(x.min() > 1)
    with pytest.raises(RuntimeError, match=rf"test_assert_async.py:{line}"):
        x.cpu()  # computed already: the read runs the assert, alone
    assert [r.trigger for r in xlakit.steps()] == ["mark_step", "mark_step", "cpu"]
    assert xlakit.metrics()["fallbacks"] == 0


def test_a_failing_assert_raises_eagers_error_at_the_read_and_the_next_step_works(dev):
    host = torch.arange(4.0)
    x = host.to(dev)
    xlakit.mark_step()
    line = _next_line()
    torch._assert_async(x.sum() < 0)
    want = _eager_error(host.sum() < 0)
    with pytest.raises(RuntimeError) as raised:
        (x * 2).cpu()
    assert str(raised.value) == f"{want} (at test_assert_async.py:{line}: aten._assert_async.default)"
    assert xlakit.metrics()["fallbacks"] == 0
    assert_same(x * 3 + 1, host * 3 + 1)
    xlakit.mark_step()
    assert_same(x, host)


def _sgd_step(w, lr):
    """An update guarded by an assert, as a training step writes it."""
    g = w * lr
    torch._assert_async(torch.isfinite(g).all(), "the update is not finite")
    w.sub_(g)
    return g


def test_a_failed_assert_stops_the_step_where_eager_stops(dev):
    # eager raises at the assert: what was recorded before it stands, w keeps its value
    # (its update, after the assert, never ran), what was recorded after it does not exist
    want = torch.ones(4)
    with pytest.raises(RuntimeError, match="^the update is not finite$"):
        _sgd_step(want, float("nan"))
    w = xlakit.label(torch.ones(4).to(dev), "w")
    xlakit.mark_step()
    g = _sgd_step(w, float("nan"))
    after = w * 3
    with pytest.raises(RuntimeError, match=r"^the update is not finite \(at test_assert_async.py:\d+: "
                                           r"aten._assert_async.msg\)$"):
        xlakit.mark_step()
    assert [d.label for d in xlakit.last_step().donated] == ["w"]  # the executable kept w's old value
    assert_same(w, want)
    assert_same(g, torch.full((4,), float("nan")), equal_nan=True)
    with pytest.raises(StepFailedError, match="the update is not finite"):
        after.cpu()
    _sgd_step(w, 0.5)   # the session goes on
    xlakit.mark_step()
    _sgd_step(want, 0.5)
    assert_same(w, want)


def test_the_msg_variant_raises_with_the_users_message(dev):
    host = torch.tensor([3, -1])
    x = host.to(dev)
    message = "class values must be non-negative, got {min}"  # braces kept, not formatted
    line = _next_line()
    torch._assert_async(x.min() >= 0, message)
    assert _eager_error(host.min() >= 0, message) == message
    with pytest.raises(RuntimeError, match=rf"^class values must be non-negative, got \{{min\}} "
                                           rf"\(at test_assert_async.py:{line}: aten._assert_async.msg\)$"):
        xlakit.mark_step()
    assert_same(x + 1, host + 1)


@pytest.mark.parametrize("cond", [torch.tensor([1, 1]), torch.tensor([])])
def test_a_condition_of_other_than_one_value_raises_eagers_error_at_once(dev, cond):
    with pytest.raises(RuntimeError, match=rf"^{_eager_error(cond)} \(at test_assert_async.py:\d+"):
        torch._assert_async(cond.to(dev))
    assert xlakit.metrics()["executions"] == 0


def test_with_checks_off_an_assert_checks_nothing(dev, monkeypatch):
    monkeypatch.setattr(xlakit.config, "checks", False)
    x = torch.zeros(2, device=dev)
    torch._assert_async(x.sum() > 0)
    assert_same(x + 1, torch.ones(2))
    assert "aten._assert_async.default" not in _ops()


def _checked_double(x):
    torch._assert_async(x.sum() > 0, "the sum must be positive")
    return x * 2


def test_a_compiled_assert_is_one_executable_that_replays_and_raises_on_bad_input(dev):
    compiled = torch.compile(_checked_double, backend="xlakit")
    host = torch.arange(4.0) + 1
    with dynamo_log() as log, xlakit.integrations.dynamo.compiled_graphs() as graphs:
        for _ in range(3):
            assert_same(compiled(host.to(dev)), host * 2)
    assert len(graphs) == 1 and graphs[0].executables == 1 and not graphs[0].splits and graphs[0].replays, graphs
    assert xlakit.steps()[-1].trigger == "compiled" and "aten._assert_async.msg" in _ops()
    assert xlakit.metrics()["fallbacks"] == 0
    assert log.xlakit_frames() == {} and not _failures(log)
    with pytest.raises(RuntimeError, match=r"^the sum must be positive \(at test_assert_async.py:\d+.*"
                                           r": aten._assert_async.msg\)$"):
        compiled(-host.to(dev))
    assert_same(compiled(host.to(dev)), host * 2)


def _one_hot(i):
    return torch.nn.functional.one_hot(i, 4)


@pytest.mark.skipif(torch.__version__ < "2.13", reason="torch 2.9's compiled one_hot has no range checks")
def test_a_compiled_one_hot_checks_its_classes_in_the_graph(dev):
    # torch 2.13's decomposition of one_hot writes its range checks as _assert_async.msg
    compiled = torch.compile(_one_hot, backend="xlakit")
    good = torch.tensor([0, 3, 1])
    with xlakit.integrations.dynamo.compiled_graphs() as graphs:
        for _ in range(2):
            assert_same(compiled(good.to(dev)), _one_hot(good))
    assert len(graphs) == 1 and graphs[0].executables == 1 and not graphs[0].splits and graphs[0].replays, graphs
    assert xlakit.metrics()["fallbacks"] == 0
    with pytest.raises(RuntimeError, match=r"^one_hot: Class values must be smaller than num_classes\. \(at "):
        compiled(torch.tensor([0, 4, 1]).to(dev))
