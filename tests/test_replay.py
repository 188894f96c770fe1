"""Record once, replay under guards (engine/tape.py): a repeated step reuses its
recording, cut and key, and whatever changes in it (an op, a constant, an input's
dtype or identity, a source line) still gives eager's values, with the record
saying where replay stopped.
"""
import os

import hypothesis
import pytest
import torch
from conftest import assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xlakit
from xlakit.core.record import Trigger
from xlakit.engine import tape
from xlakit.engine.executor import current as engine

EXAMPLES = int(os.environ.get("XLAKIT_FUZZ_EXAMPLES", "15"))
RANDOM = os.environ.get("XLAKIT_FUZZ_RANDOM", "") == "1"
SHAPE = (4, 5)


def last():
    return xlakit.steps()[-1]


def test_a_training_step_replays_after_it_was_recorded_and_matches_eager(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    lazy_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(dev)
    lazy_model.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    lazy_opt = torch.optim.AdamW(lazy_model.parameters(), lr=1e-2)
    data = [torch.randn(4, 8) for _ in range(5)]
    replays = []
    for x in data:
        for m, o, inp in ((model, opt, x), (lazy_model, lazy_opt, x.to(dev))):
            loss = m(inp).square().mean()
            loss.backward()
            o.step()
            o.zero_grad()
        xlakit.mark_step()
        replays.append(last().replay)
        for p, q in zip(model.parameters(), lazy_model.parameters()):
            torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)
    # the first two steps follow other syncs (the step before the loop, the first marker),
    # the third records, from the fourth on they replay
    assert "not kept for replay" in replays[1].why and replays[2].recorded > 0
    assert replays[-1].recorded == 0 and replays[-1].replayed > 50 and replays[-1].why == ""
    assert replays[-2] == replays[-1]
    assert replays[0].recorded > 0 and replays[0].why


def _step(x, y, scale):
    return (x * y + scale).tanh().sum(0)


def test_a_changed_shape_stops_replay_at_its_op_and_says_so(dev):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    for _ in range(4):
        out = _step(x.to(dev), y.to(dev), 0.5)
        xlakit.mark_step()
    assert last().replay.recorded == 0
    wide, wide_y = torch.randn(8, 5), torch.randn(8, 5)
    out = _step(wide.to(dev), wide_y.to(dev), 0.5)
    xlakit.mark_step()
    replay = last().replay
    assert replay.replayed == 0 and replay.recorded > 0
    # (.to(device) uploads at once: it records no op)
    assert replay.why.startswith("op 0 `aten.mul.Tensor`: argument 0 now f32[8,5], was f32[4,5]")
    assert "test_replay.py" in replay.why  # where it was recorded, and where it is now
    torch.testing.assert_close(out.cpu(), _step(wide, wide_y, 0.5))


def test_one_input_read_twice_is_not_two_inputs(dev):
    """f(a, a) and f(a, b) record the same ops on the same avals: the guard tells them apart."""
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    la, lb = a.to(dev), b.to(dev)
    for _ in range(4):
        out = la * lb + 1
        xlakit.mark_step()
    assert last().replay.recorded == 0
    out = la * la + 1
    xlakit.mark_step()
    assert last().replay.replayed == 0 and "reads another value" in last().replay.why
    torch.testing.assert_close(out.cpu(), a * a + 1)


def _called_here(x):
    return (x * 2).relu() + 1


def _called_there(x):  # the same ops from other lines
    return (x * 2).relu() + 1


def test_a_replayed_node_shows_this_steps_source_line(dev):
    x = torch.randn(3, 3).to(dev)
    records = []
    for call in (_called_here, _called_here, _called_here, _called_here, _called_there):
        out = call(x)
        xlakit.mark_step()
        records.append(last())
    here, there = records[3], records[4]
    assert here.replay.recorded == 0 and there.replay.recorded == 0  # sources are metadata
    assert there.key == here.key and there.metadata_digest != here.metadata_digest
    lines = {node.source.user.function for node in there.graph.nodes}
    assert "_called_there" in lines and "_called_here" not in lines
    torch.testing.assert_close(out.cpu(), _called_here(x.cpu()))


def test_runs_that_keep_differing_are_recorded_ever_more_seldom_and_stay_eagers(dev):
    """Two steps alternating after one marker: each differs from the one before, so recording
    them is wasted work; after three such runs in a row one in 2, 4, ... is recorded. A step
    that repeats again replays within the wait."""
    x = torch.randn(4, 5)
    lx = x.to(dev)
    steps = [lambda t: (t * 2).sin() + 1, lambda t: (t + 2).cos() * 3]
    replays = []
    for i in range(14):
        out = steps[i % 2](lx)
        xlakit.mark_step()
        replays.append(last().replay)
        torch.testing.assert_close(out.cpu(), steps[i % 2](x))
    assert "the first run of the code after this step marker: traced, not kept for replay" in replays[1].why
    assert [r.why.split(" (")[0] for r in replays[3:6]] == \
        ["op 0 is now `aten.add.Tensor`, was `aten.mul.Tensor`", "op 0 is now `aten.mul.Tensor`, was `aten.add.Tensor`",
         "op 0 is now `aten.add.Tensor`, was `aten.mul.Tensor`"]
    assert replays[6].why == ("not kept for replay: the last 3 runs of the code after this step marker each differed "
                              "from the one before")
    for i in range(14, 14 + tape.BACKOFF + 2):
        out = steps[0](lx)
        xlakit.mark_step()
        torch.testing.assert_close(out.cpu(), steps[0](x))
    assert last().replay.recorded == 0 and last().replay.why == "", last().replay


def test_reads_in_the_middle_of_a_replayed_step(dev):
    torch.manual_seed(1)
    w = torch.randn(5, 5)
    lw, w64 = w.to(dev), w.double()  # the exact answer, to measure eager's float32 rounding against
    items, lazy_items, items64 = [], [], []
    for i in range(5):
        x = torch.full((2, 5), float(i))
        h, h64 = (x @ w).sin(), (x.double() @ w64).sin()
        lh = (x.to(dev) @ lw).sin()
        items.append(h.sum().item())
        items64.append(h64.sum().item())
        lazy_items.append(lh.sum().item())  # a partial sync: ends the run, begins another
        w, w64 = w + h.mean(), w64 + h64.mean()
        lw.add_(lh.mean())
        xlakit.mark_step()
        _within_twice_eagers_rounding(lw.cpu(), w, w64)
    _within_twice_eagers_rounding(torch.tensor(lazy_items), torch.tensor(items), torch.tensor(items64))
    item_step, marker_step = xlakit.steps()[-2:]
    assert item_step.replay.recorded == 0 and marker_step.replay.recorded == 0


def _within_twice_eagers_rounding(got, eager, exact):
    """`got` is as close to the float64 answer as twice eager's float32 result is, plus an ulp: a
    tolerance from eager's own rounding, not from one machine's run (XLA's sin and matmul round
    apart from eager's kernels, and apart on each CPU: 1e-5 failed on one machine of this kind)."""
    error, eagers = (got.double() - exact).abs().max(), (eager.double() - exact).abs().max()
    assert error <= 2 * eagers + torch.finfo(torch.float32).eps * exact.abs().max(), (error, eagers)


# -- fuzz: a random step repeated, then changed at one random point -------------------
slot = st.integers(0, 5)
unit = st.floats(-1.5, 1.5, allow_nan=False, allow_infinity=False, width=32)
instruction = st.one_of(
    st.tuples(st.just("binary"), st.sampled_from(["add", "sub", "mul", "maximum"]), slot, slot),
    st.tuples(st.just("unary"), st.sampled_from(["tanh", "sin", "abs", "neg"]), slot),
    st.tuples(st.just("scalar"), st.sampled_from(["add", "mul"]), slot, unit),
    st.tuples(st.just("inplace"), st.sampled_from(["add_", "mul_"]), slot, unit),
    st.tuples(st.just("view"), st.sampled_from(["t", "row", "block"]), slot, unit),
    st.tuples(st.just("matmul"), slot, slot),
    st.tuples(st.just("reduce"), st.sampled_from(["sum", "amax"]), slot, st.integers(0, 1)),
)


def _run(pool, ins):
    kind, *a = ins
    t = lambda i: pool[i % len(pool)]  # noqa: E731
    if kind == "binary":
        pool.append(getattr(torch, a[0])(t(a[1]), t(a[2])))
    elif kind == "unary":
        pool.append(getattr(torch, a[0])(t(a[1])))
    elif kind == "scalar":
        pool.append(t(a[1]) + a[2] if a[0] == "add" else t(a[1]) * a[2])
    elif kind == "inplace":
        getattr(t(a[1]), a[0])(a[2])
    elif kind == "view":
        x = t(a[1])
        {"t": lambda: x.t(), "row": lambda: x[1], "block": lambda: x[1:3, 1:4]}[a[0]]().mul_(a[2])
    elif kind == "matmul":
        pool.append(t(a[0]) @ t(a[1]).T @ t(a[0]) / 25)
    elif kind == "reduce":
        x = t(a[1])
        pool.append(x - getattr(x, a[0])(dim=a[2], keepdim=True))


def _mutate(program, where: int, how: str):
    """The program with instruction `where` changed `how` (its op, a constant of the graph, a
    Python float, or which tensor it reads); None if that instruction has no such part."""
    kind, *a = program[where]
    if how == "op" and kind in ("binary", "unary"):
        names = {"binary": ["add", "sub", "mul", "maximum"], "unary": ["tanh", "sin", "abs", "neg"]}[kind]
        changed = (kind, names[(names.index(a[0]) + 1) % len(names)], *a[1:])
    elif how == "scalar" and kind in ("scalar", "inplace", "view"):
        changed = (kind, *a[:-1], a[-1] + 0.25)
    elif how == "constant" and kind == "reduce":
        changed = (kind, a[0], a[1], 1 - a[2])
    elif how == "identity" and kind in ("binary", "matmul"):
        changed = (kind, *a[:-1], a[-1] + 1) if kind == "binary" else (kind, a[0], a[1] + 1)
    else:
        return None
    return program[:where] + [changed] + program[where + 1:]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), program=st.lists(instruction, min_size=1, max_size=25),
       where=st.integers(0, 24), how=st.sampled_from(["op", "constant", "scalar", "identity", "input dtypes", "input shapes", "none"]))
def test_a_repeated_step_changed_at_one_point_matches_eager(dev, seed, program, where, how):
    program = [("unary", "tanh", 0)] + program  # every step reads input 0
    where %= len(program)
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(SHAPE, generator=gen) for _ in range(3)]
    changed = program if how in ("none", "input dtypes", "input shapes") else _mutate(program, where, how)
    hypothesis.assume(changed is not None)
    lazy_start = [t.to(dev) for t in start]
    xlakit.mark_step()
    for step in range(5):
        last_step = step == 4
        steps = program if not last_step else changed
        eager = [t.clone() for t in start]
        lazy = [t.clone() for t in lazy_start]  # the same input buffers every step
        if last_step and how in ("input dtypes", "input shapes"):
            eager = [t.double() if how == "input dtypes" else t.t().contiguous() for t in start]
            lazy = [t.to(dev) for t in eager]
        for ins in steps:
            _run(eager, ins)
            _run(lazy, ins)
        xlakit.mark_step()
        for k, (got, want) in enumerate(zip(lazy, eager)):
            torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=2e-3,
                                       msg=lambda m: f"tensor {k} at step {step} of {steps}: {m}")
        replay = last().replay
        if step == 3 or (last_step and how == "none"):
            assert replay.recorded == 0 and replay.why == "", (steps, replay)
    if how in ("scalar", "identity"):
        # a Python float is an input of the graph (lifted), not a constant; and another input
        # buffer first read at the same point is the same graph fed another buffer: either may
        # replay, and the values above are eager's either way
        assert replay.why == "" or replay.why.startswith("op "), (changed, replay)
    elif how != "none":
        assert replay.why.startswith("op ") and replay.recorded > 0, (changed, how, replay)


def test_a_compiled_graph_recorded_again_replays_only_on_inputs_from_the_same_places(dev):
    # a compiled forward and backward join the lazy step (integrations/dynamo.py) and are matched
    # as one op: fed the other of two pending values of one shape, the step records anew (reusing
    # the last step's cut would compute from the wrong one); fed the same, it replays
    torch.manual_seed(0)
    eager = torch.nn.Linear(4, 3)
    model = torch.nn.Linear(4, 3).to(dev)
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="xlakit")
    x = torch.randn(2, 4)
    xd = x.to(dev)
    replays = []
    for choice in [0, 1, 0, 1, 0, 1, 1, 1, 1]:
        loss = compiled([xd * 2, xd * 3][choice]).square().sum()
        loss.backward()
        xlakit.mark_step()
        want = eager([x * 2, x * 3][choice]).square().sum()
        want.backward()
        torch.testing.assert_close(loss.cpu(), want.detach())
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad)
            p.grad, q.grad = None, None
        replays.append(last().replay)
    # the first step's graphs ran as they were traced: its marker computes nothing, yet the run after
    # it begins there; that one is traced, the next recorded to be matched; steps 3 to 5 differ from
    # the step before, so step 6 is not recorded (the tape's back-off); the same inputs again replay
    assert "not kept for replay" in replays[1].why and "replay it" in replays[2].why, replays
    assert all("compiled graph recorded again on inputs from other places" in r.why for r in replays[3:6]), replays
    assert "each differed from the one before" in replays[6].why, replays
    assert all(r.recorded == 0 for r in replays[7:]), replays


SCALAR_OPS = {
    "fill_": lambda t, v: t.clone().fill_(v),
    "masked_fill": lambda t, v: t.masked_fill(t > 0, v),
    "add_alpha": lambda t, v: t.add(t, alpha=v),
    "clamp_min": lambda t, v: t.clamp(min=v),
}


@pytest.mark.parametrize("dtype, too_big", [(torch.float16, 1e10), (torch.float32, 1e39)], ids=["float16", "float32"])
@pytest.mark.parametrize("name", SCALAR_OPS)
def test_a_replayed_op_checks_its_python_scalars_as_a_fresh_record_does(dev, name, dtype, too_big):
    # from the third run of a loop on, the op is replayed and its scalar is an input: a value
    # that no longer fits the dtype gave inf or ignored the clamp, where eager (and a fresh
    # recording) raise. After the error the loop goes on, replaying again.
    op = SCALAR_OPS[name]
    for value in (1.0, 2.0, 3.0, too_big, 4.0, 5.0):
        eager = torch.arange(4.0, dtype=dtype) - 1
        try:
            want = op(eager, value)
        except RuntimeError as error:
            with pytest.raises(RuntimeError, match="without overflow"):
                op(eager.to(dev), value)
            assert "without overflow" in str(error)
            continue
        got = op(eager.to(dev), value)
        xlakit.mark_step()
        assert_same(got, want)
    assert last().replay.replayed > 0  # the last run replayed its recording


def test_a_replayed_op_passed_a_scalar_its_recording_left_out_checks_it(dev):
    # a replayed op whose call passes none of its checked scalars (add without alpha) skips the
    # check; the same op passed one after runs that left it out is checked as a fresh record is
    eager = torch.arange(4.0, dtype=torch.float16) - 1
    replayed = []
    for alpha in (None, None, None, None, 1e10, None, 2.0, None):
        kwargs = {} if alpha is None else {"alpha": alpha}
        if alpha == 1e10:
            assert replayed[-1] > 0  # the run before replayed add without its alpha
            with pytest.raises(RuntimeError, match="without overflow"):
                eager.add(eager, **kwargs)
            with pytest.raises(RuntimeError, match="without overflow"):
                eager.to(dev).add(eager.to(dev), **kwargs)
            continue
        got = eager.to(dev).add(eager.to(dev), **kwargs)
        xlakit.mark_step()
        replayed.append(last().replay.replayed)
        assert_same(got, eager.add(eager, **kwargs))


# -- a partial sync mid-step: the run after it reads what it left pending ------------------
def _mid_step_read(inp, first, second, read):
    """`first` and `second` recorded, a partial sync of `read` of them, then the step's end reads `second`'s."""
    a = first(inp)
    b = second(a)
    s = inp.sum()
    xlakit.sync([{"a": a, "s": s}[read]])  # one line: the run after it begins at the same sync
    return b * 2


def test_the_run_after_a_partial_sync_replays_what_it_left_pending(dev):
    """transformers' models read their mask with .item() after the embedding, which the marker
    computes; the run after the read is replayed (it recorded every step before)."""
    engine().forget_recordings()  # the runs other tests began at these lines
    x = torch.randn(4, 5)
    lx = x.to(dev)
    for _ in range(5):
        out = _mid_step_read(lx, torch.sin, torch.cos, "s")
        xlakit.mark_step()
        torch.testing.assert_close(out.cpu(), _mid_step_read(x, torch.sin, torch.cos, "s"))
    assert last().replay.recorded == 0 and last().replay.why == "", last().replay


def test_the_run_after_a_partial_sync_replays_when_the_run_before_it_was_not_recorded(dev):
    """Each step begins after another sync (a benchmark's peers take turns, a notebook runs
    other cells), so the run before the read is each time the first after its sync, not
    recorded; the run after it still finds what it reads."""
    engine().forget_recordings()  # the runs other tests began at these lines
    x = torch.randn(4, 5)
    lx = x.to(dev)
    for i in range(5):
        out = _mid_step_read(lx, torch.sin, torch.cos, "s")
        engine().sync(trigger=Trigger.MARK_STEP, source=f"marker {i}")
        torch.testing.assert_close(out.cpu(), _mid_step_read(x, torch.sin, torch.cos, "s"))
    marker = [r for r in xlakit.steps() if r.trigger == Trigger.MARK_STEP][-1]
    assert marker.replay.recorded == 0 and marker.replay.why == "", marker.replay


def test_a_pending_value_of_another_shape_from_before_a_partial_sync_is_not_replayed(dev):
    """At the same place in the run before, another shape: that run was recorded anew, and the
    run after must infer from the new shape (replaying gave the old step's shapes)."""
    engine().forget_recordings()  # the runs other tests began at these lines
    x, wide = torch.randn(4, 5), torch.randn(5, 4)
    lx, lwide = x.to(dev), wide.to(dev)
    for inp, lazy in [(x, lx)] * 4 + [(wide, lwide)]:
        out = _mid_step_read(lazy, torch.sin, lambda t: t.sum(0), "s")
        xlakit.mark_step()
        assert_same(out, _mid_step_read(inp, torch.sin, lambda t: t.sum(0), "s"))
    assert "now reads another value" in last().replay.why or "now f32" in last().replay.why, last().replay


def test_a_run_before_that_differed_keeps_the_marker_from_reusing_its_cut(dev):
    """The run after the read matches whole (same shapes), but the run before it computed
    cos where it computed sin: a cut and key reused from the step before would run sin."""
    engine().forget_recordings()  # the runs other tests began at these lines
    x = torch.randn(4, 5)
    lx = x.to(dev)
    for first in [torch.sin] * 4 + [torch.cos]:
        out = _mid_step_read(lx, first, torch.tanh, "s")
        xlakit.mark_step()
        torch.testing.assert_close(out.cpu(), _mid_step_read(x, first, torch.tanh, "s"))
    assert last().replay.recorded == 0  # its own ops matched


def test_a_partial_sync_that_computed_other_values_keeps_the_marker_from_reusing_its_cut(dev):
    """The same ops, but the read computed `a` where it computed the sum: the marker's graph
    reads `a` as an input, as a fresh cut makes it (the reused cut computed `a` again)."""
    engine().forget_recordings()  # the runs other tests began at these lines
    x = torch.randn(4, 5)
    lx = x.to(dev)
    for read in ["s"] * 4 + ["a"]:
        out = _mid_step_read(lx, torch.sin, torch.tanh, read)
        xlakit.mark_step()
        torch.testing.assert_close(out.cpu(), _mid_step_read(x, torch.sin, torch.tanh, read))
    replayed = last()
    engine().forget_recordings()
    out = _mid_step_read(lx, torch.sin, torch.tanh, "a")
    xlakit.mark_step()
    fresh = last()
    assert fresh.replay.replayed == 0
    assert (replayed.num_nodes, replayed.num_inputs, replayed.key) == (fresh.num_nodes, fresh.num_inputs, fresh.key)


def test_a_replayed_op_keeps_eagers_strides_and_offset(dev):
    """A replayed op's outputs are made without strides where they are contiguous from offset 0;
    others keep theirs (a product of a transpose is laid out as it, a slice has an offset), as
    eager's and a fresh record's."""
    engine().forget_recordings()
    x = torch.arange(20.0).reshape(4, 5)
    lx = x.to(dev)
    for _ in range(4):
        made = [lx.t() * 2, lx[1:], lx.t(), lx * 2]
        xlakit.mark_step()
    assert last().replay.recorded == 0 and last().replay.replayed > 0, last().replay
    for got, want in zip(made, [x.t() * 2, x[1:], x.t(), x * 2]):
        assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
        assert_same(got, want)



def test_an_operand_of_the_same_value_laid_out_otherwise_stops_replay_and_keeps_eagers_strides(dev):
    """`contiguous()` of a transpose is the transpose's value laid out anew (no node): an op that
    reads it one step and the transpose itself the next reads the same node's output, and only
    the layout guard tells them apart. The replay stops there, saying so, and each product is laid
    out as eager lays it out (a transposed input gives a transposed product)."""
    engine().forget_recordings()
    x = torch.arange(16.0).reshape(4, 4)
    lx = x.to(dev)
    replays = []
    for k in range(6):
        made = []
        for src in (x, lx):
            v = (src * 2).t()
            c = v.contiguous()
            made.append((c if k < 4 else v) * 3)
        xlakit.mark_step()
        want, got = made
        assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
        assert_same(got, want)
        replays.append(last().replay)
    assert replays[3].recorded == 0 and replays[3].replayed > 0, replays
    assert "now has strides (1, 4), was (4, 1)" in replays[4].why, replays[4]

def _updates_without_labels(a, b, c):
    """Three unlabeled tensors of one shape, each updated from another: only the chains from
    each new value back to its input (stages.updated_from) pair donors with outputs."""
    a.mul_(0.5).add_(b)
    b.add_(c * 2)
    c.copy_(b - a)


def test_a_replayed_marker_donates_as_a_fresh_cut_does_without_walking_the_chains(dev, monkeypatch):
    """The replayed marker takes each root's update from its recording's plan (Plan.updates); it
    donates and pairs as a fresh cut of the same step does, with donation turned off for the
    recorded step and on for the replayed ones (the recording then knows none), values as eager's."""
    from xlakit.config import config
    from xlakit.engine import stages

    engine().forget_recordings()  # the runs other tests began at these lines
    eager = [torch.randn(3, 4) for _ in range(3)]
    lazy = [t.to(dev) for t in eager]
    walked = []
    updated_from = stages.updated_from
    monkeypatch.setattr(stages, "updated_from", lambda *a: walked.append(a) or updated_from(*a))
    records = []
    for step in range(6):
        monkeypatch.setattr(config, "donate", step != 2)  # the step recorded for replay donates nothing
        walked.clear()
        _updates_without_labels(*eager)
        _updates_without_labels(*lazy)
        xlakit.mark_step()
        records.append((last(), len(walked)))
        for e, t in zip(eager, lazy):
            torch.testing.assert_close(t.cpu(), e)
    (recorded, _), (first_replay, walks_first) = records[2], records[3]
    assert recorded.replay.recorded > 0 and not recorded.donated
    assert first_replay.replay.recorded == 0 and walks_first == 3  # its recording planned no donation
    assert all(r.replay.recorded == 0 and walks == 0 for r, walks in records[4:])
    engine().forget_recordings()
    _updates_without_labels(*eager)
    _updates_without_labels(*lazy)
    xlakit.mark_step()
    fresh = last()
    assert fresh.replay.replayed == 0
    assert len(fresh.donated) == 3
    for replayed, _ in records[3:]:
        assert (replayed.key, replayed.donated, replayed.donation_note) == (fresh.key, fresh.donated, fresh.donation_note)


def test_a_python_scalar_is_checked_against_the_dtype_its_op_has_now(dev):
    """A replayed op's Python scalars are checked once its tensors matched the recording: the same
    ops on bfloat16 after a run recorded on float16 check 65536 against bfloat16's range, which
    holds it, not float16's, which does not (an upload records no op: the clamp is the run's first)."""
    for dtype, bound in ((torch.float16, 1.0),) * 3 + ((torch.bfloat16, 65536.0),):
        x = torch.tensor([0.5, -7e4 if dtype is torch.bfloat16 else -2.0], dtype=dtype)
        got = x.to(dev).clamp(-bound, bound).cpu()
        xlakit.mark_step()
        assert torch.equal(got, x.clamp(-bound, bound)), dtype


def test_a_marker_with_nothing_to_compute_ends_its_run(dev):
    """A loop whose results die before its marker (a step that only keeps what it read) computes
    nothing at the marker: its run still ends there, so the next step's ops are matched against
    it and replayed, and the dead steps' nodes (and the buffers they read) are not kept."""
    engine().forget_recordings()
    x = torch.randn(4, 5)
    lx = x.to(dev)
    for keep in (False, False, False, True):  # one marker line: the runs it begins are matched
        y = (lx * 2).sin()
        if not keep:
            del y
            assert engine()._tape._run.ops == 2  # this step's ops alone, not those of the steps before
        xlakit.mark_step()
    assert last().replay.recorded == 0 and last().replay.replayed == 2, last().replay
    torch.testing.assert_close(y.cpu(), (x * 2).sin())
