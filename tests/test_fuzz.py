"""Differential fuzzing: random programs run eagerly and through xlakit must agree.

After every sync, all live tensors of the program are compared. Some
instructions may be bad input (an index out of range, an integer division by
zero): where eager raises, the program stops there, and xlakit must raise the
same exception at its next sync, and leave no tensor with a wrong value
(each either equals eager's or raises). CI runs a bounded number of examples;
`make fuzz` runs many more (XLAKIT_FUZZ_EXAMPLES).
"""
import gc
import io
import os
import tempfile

import pytest
import torch
import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xlakit

SHAPE = (4, 5)
EXAMPLES = int(os.environ.get("XLAKIT_FUZZ_EXAMPLES", "40"))
# CI replays the same examples every run; `make fuzz` explores new ones
RANDOM = os.environ.get("XLAKIT_FUZZ_RANDOM", "") == "1"

unit = st.floats(-1.5, 1.5, allow_nan=False, allow_infinity=False, width=32)
slot = st.integers(0, 7)
views = st.sampled_from(["row", "col", "block", "t", "diag", "flat"])
# an index that replaces the first of a list of good ones: None, or one just outside some op's range
maybe_bad = st.sampled_from([None] * 9 + [-5, 4, 5, -21, 20])

RELAYOUTS = {
    "t_reshape": lambda t: t.t().reshape(5, 4).t(),          # a copy: t() is not contiguous
    "t_contiguous": lambda t: t.t().contiguous().t(),
    "t_flatten": lambda t: t.t().flatten().view(5, 4).t(),
    "flatten": lambda t: t.flatten().view(4, 5),             # a view: t is contiguous
    "cols_reshape": lambda t: torch.cat([t[:, ::2].reshape(-1), t[:, 1::2].reshape(-1)]).view(4, 5),
    "expand_contiguous": lambda t: t[:1].expand(4, 5).contiguous(),
    "clone": lambda t: t.t().clone().t(),
}


# the instructions both modes draw (the loops', below, leave out step markers, files, random draws,
# fallbacks and the writes eager refuses)
binary = st.tuples(st.just("binary"), st.sampled_from(["add", "sub", "mul", "maximum"]), slot, slot)
unary = st.tuples(st.just("unary"), st.sampled_from(["tanh", "sin", "abs", "neg", "relu"]), slot)
scalar = st.tuples(st.just("scalar"), st.sampled_from(["add", "mul", "rsub"]), slot, unit)
matmul = st.tuples(st.just("matmul"), slot, slot)
center = st.tuples(st.just("center"), slot, st.integers(0, 1))
inplace = st.tuples(st.just("inplace"), st.sampled_from(["add_", "mul_", "fill_", "zero_", "clamp_"]), slot, unit)
view_inplace = st.tuples(st.just("view_inplace"), views,
                         st.sampled_from(["add_", "mul_", "fill_", "copy_", "addcmul_", "addcdiv_", "lerp_"]), slot,
                         slot, unit)
index_put = st.tuples(st.just("index_put"), slot, st.lists(st.integers(0, 3), min_size=1, max_size=3), unit)
cast = st.tuples(st.just("cast"), slot, st.sampled_from([torch.float64, torch.bfloat16, torch.float16]))
partial_sync = st.tuples(st.just("partial_sync"), st.lists(slot, max_size=3))
item = st.tuples(st.just("item"), slot)
INDEXING = ["index", "index_select", "gather", "embedding", "take"]
DIVISIONS = ["floor_divide", "remainder", "fmod", "trunc"]
relayout = st.tuples(st.just("relayout"), st.sampled_from(list(RELAYOUTS)), slot)
# half types with a Python scalar outside their range or below their precision
half_scalar = st.tuples(st.just("half_scalar"), slot, st.sampled_from([torch.float16, torch.bfloat16]),
                        st.sampled_from(["mul", "div", "add"]), st.sampled_from([65536.0, 1e-8, 1e5, 3e-5, 7.0]))
# an attention mask uploaded and read in Python, as transformers reads it (answered on the host:
# front/host_reads.py), choosing which ops the step records
mask_read = st.tuples(st.just("mask_read"), slot, st.lists(st.integers(0, 1), min_size=5, max_size=5),
                      st.integers(-3, 3))

instructions = st.one_of(
    binary, unary, scalar, matmul, center, inplace, view_inplace, index_put, cast, mask_read,
    st.tuples(st.just("masked_sum"), slot, slot),              # data-dependent shape: eager fallback
    st.tuples(st.just("mark_step")), partial_sync, item,
    st.tuples(st.just("save"), slot),
    # may be bad input (about one in four): an index a little outside the shape (4, 5), a divisor 0
    st.tuples(st.just("bad_index"), st.sampled_from(INDEXING), slot,
              st.lists(st.integers(0, 3), min_size=4, max_size=4), maybe_bad),
    st.tuples(st.just("bad_index_put"), slot, st.lists(st.integers(0, 3), min_size=1, max_size=3), maybe_bad, unit),
    st.tuples(st.just("int_div"), st.sampled_from(DIVISIONS), slot, st.sampled_from([1, 2, -1, -2, 3, 0])),
    # copies and views made from views: a copy must not alias (strides as eager's); writes through
    # overlapping windows; writes to an expanded tensor (eager refuses them)
    relayout,
    st.tuples(st.just("unfold_write"), slot, st.sampled_from([(5, 3), (2, 3), (4, 4), (3, 1)]), st.integers(0, 1),
              unit),
    st.tuples(st.just("expand_inplace"), st.sampled_from(["add_", "mul_", "fill_", "copy_"]), slot, unit),
    half_scalar,
    # random ops on the device interleaved with torch.rand on the CPU: one generator
    st.tuples(st.just("random"), slot, st.integers(0, 2**16)),
    # a .grad held across backwards keeps accumulating
    st.tuples(st.just("held_grad"), slot),
    st.tuples(st.just("save_load"), slot),
)


def view_of(t, kind):
    return {"row": lambda: t[1], "col": lambda: t[:, 2], "block": lambda: t[1:3, 1:4],
            "t": lambda: t.t(), "diag": lambda: t.diagonal(), "flat": lambda: t.view(-1)[3:9]}[kind]()


class Program:
    """Interprets instructions over a pool of tensors; `sync` is a no-op eagerly."""

    def __init__(self, pool, lazy):
        self.pool, self.lazy, self.items = pool, lazy, []

    def t(self, i):
        return self.pool[i % len(self.pool)]

    def run(self, ins, check):
        kind, *a = ins
        if kind == "binary":
            self.pool.append(getattr(torch, a[0])(self.t(a[1]), self.t(a[2])))
        elif kind == "unary":
            self.pool.append(getattr(torch, a[0])(self.t(a[1])))
        elif kind == "scalar":
            op = {"add": lambda x, c: x + c, "mul": lambda x, c: x * c, "rsub": lambda x, c: c - x}[a[0]]
            self.pool.append(op(self.t(a[1]), a[2]))
        elif kind == "matmul":
            self.pool.append(self.t(a[0]) @ self.t(a[1]).T @ self.t(a[0]) / 25)
        elif kind == "center":
            x = self.t(a[0])
            self.pool.append(x - x.mean(dim=a[1], keepdim=True))
        elif kind == "inplace":
            x = self.t(a[1])
            {"add_": lambda: x.add_(a[2]), "mul_": lambda: x.mul_(a[2]), "fill_": lambda: x.fill_(a[2]),
             "zero_": x.zero_, "clamp_": lambda: x.clamp_(-abs(a[2]), abs(a[2]))}[a[0]]()
        elif kind == "view_inplace":
            view, op, i, j, c = a
            v = view_of(self.t(i), view)
            src = view_of(self.t(j), view)
            {"add_": lambda: v.add_(c), "mul_": lambda: v.mul_(c), "fill_": lambda: v.fill_(c),
             "copy_": lambda: v.copy_(src.clone()), "addcmul_": lambda: v.addcmul_(src, src, value=c),
             "addcdiv_": lambda: v.addcdiv_(src, src.abs() + 1, value=c), "lerp_": lambda: v.lerp_(src, c)}[op]()
        elif kind == "index_put":
            x = self.t(a[0])
            idx = torch.tensor(a[1])
            x[idx] = a[2]
        elif kind == "cast":
            self.pool.append(self.t(a[0]).to(a[1]).to(torch.float32))
        elif kind == "mask_read":
            x = self.t(a[0])
            mask = torch.tensor(a[1], device=x.device)
            if bool(mask.bool().sum() == mask.numel()):  # transformers' fast_all
                self.pool.append(x * 2)
            else:
                self.pool.append(x.masked_fill(~mask.bool(), 0.0))
            self.items.append((mask.cumsum(0) * 3 + a[2]).max().item())
        elif kind == "masked_sum":
            x = self.t(a[0])
            self.pool.append(self.t(a[1]) + x[x > 0].sum())
        elif kind == "item":
            self.items.append(self.t(a[0]).sum().item())
        elif kind == "save" and self.lazy:
            with tempfile.TemporaryDirectory() as d:
                xlakit.save(self.t(a[0]), os.path.join(d, "t.pt"))
                self.items.append(torch.load(os.path.join(d, "t.pt")).sum().item())
        elif kind == "save":
            self.items.append(self.t(a[0]).clone().sum().item())
        elif kind == "bad_index":
            op, x, ints = a[0], self.t(a[1]), a[2] if a[3] is None else [a[3], *a[2][1:]]
            idx = torch.tensor(ints, device=x.device)
            flat = idx[:, None] * 5 + torch.arange(5, device=x.device)
            self.pool.append({"index": lambda: x[idx],                                  # rows: [-4, 4)
                              "index_select": lambda: x.index_select(1, torch.cat([idx, idx[:1]])),  # [0, 5)
                              "gather": lambda: x.gather(1, idx[:, None].expand(4, 5)),  # [0, 5)
                              "embedding": lambda: torch.nn.functional.embedding(idx, x),  # [0, 4)
                              "take": lambda: x.take(flat)}[op]())                     # [-20, 20)
        elif kind == "bad_index_put":
            x, ints = self.t(a[0]), a[1] if a[2] is None else [a[2], *a[1][1:]]
            x[torch.tensor(ints, device=x.device)] = a[3]
        elif kind == "int_div":
            op, x, d = a[0], (self.t(a[1]) * 4).to(torch.int64), a[2]
            divisor = torch.full((5,), d, device=x.device)
            result = {"floor_divide": lambda: x // divisor, "remainder": lambda: x % divisor,
                      "fmod": lambda: torch.fmod(x, divisor),
                      "trunc": lambda: torch.div(x, divisor, rounding_mode="trunc")}[op]()
            self.pool.append(result.to(torch.float32))
        elif kind == "relayout":
            self.pool.append(RELAYOUTS[a[0]](self.t(a[1])))
        elif kind == "unfold_write":
            x, (size, step), column, c = self.t(a[0]), a[1], a[2], a[3]
            x.view(-1).unfold(0, size, step)[:, column] = c
        elif kind == "expand_inplace":
            op, x, c = a[0], self.t(a[1]), a[2]
            e = x[:1].expand(4, 5)
            {"add_": lambda: e.add_(c), "mul_": lambda: e.mul_(c), "fill_": lambda: e.fill_(c),
             "copy_": lambda: e.copy_(x.clone())}[op]()
        elif kind == "half_scalar":
            x, op, c = self.t(a[0]).to(a[1]), a[2], a[3]
            result = {"mul": lambda: x * c, "div": lambda: x / c, "add": lambda: x + c}[op]()
            self.pool.append(result.to(torch.float32).nan_to_num(posinf=1e4, neginf=-1e4) / 1e4)
        elif kind == "random":
            torch.manual_seed(a[1])
            x = self.t(a[0])
            self.pool.append(torch.nn.functional.dropout(x, 0.5) + torch.rand(SHAPE).to(x.device))
        elif kind == "held_grad":
            p = self.t(a[0]).detach().clone().requires_grad_()
            (p * 2).sum().backward()
            held = p.grad
            (p * p).sum().backward()
            self.pool.append(held.detach() * 1)
        elif kind == "save_load":
            buffer = io.BytesIO()
            x = self.t(a[0])
            torch.save({"x": x, "again": x}, buffer)
            buffer.seek(0)
            loaded = torch.load(buffer)
            assert loaded["x"].device.type == "cpu"
            self.pool.append(loaded["x"].to(x.device) + loaded["again"].to(x.device))
        elif kind == "mark_step" and self.lazy:
            xlakit.mark_step()
        elif kind == "partial_sync" and self.lazy:
            xlakit.sync([self.t(i) for i in a[0]])
        if kind in ("mark_step", "partial_sync", "item", "save"):
            check()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), program=st.lists(instructions, min_size=1, max_size=40))
def test_random_programs_match_eager(dev, seed, program):
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(SHAPE, generator=gen) for _ in range(3)]
    eager = Program([t.clone() for t in start], lazy=False)
    lazy = Program([t.to(dev) for t in start], lazy=True)

    def check():
        for k, (got, want) in enumerate(zip(lazy.pool, eager.pool)):
            torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=2e-3, equal_nan=True,
                                       msg=lambda m: f"tensor {k} after {program}: {m}")
        assert len(lazy.items) == len(eager.items)
        torch.testing.assert_close(torch.tensor(lazy.items), torch.tensor(eager.items), rtol=2e-2, atol=2e-3,
                                   equal_nan=True)

    for ins in program:
        before = [t.clone() for t in eager.pool]
        try:
            eager.run(ins, lambda: None)
        except (IndexError, RuntimeError) as error:  # bad input: the eager program stops here
            # (eager may have written part of an in-place update before it raised: compare with
            # the values before the bad instruction, which xlakit gives back)
            try:
                lazy.run(ins, check)
            except type(error):
                pass  # refused when recorded, where eager refuses it
            else:
                with pytest.raises(type(error)):
                    xlakit.mark_step()
            for k, (got, want) in enumerate(zip(lazy.pool, before)):
                try:
                    host = got.cpu()
                except type(error):
                    continue  # poisoned by the failed step: it depends on the bad instruction
                torch.testing.assert_close(host, want, rtol=2e-2, atol=2e-3, equal_nan=True,
                                           msg=lambda m: f"tensor {k} after the failed {ins} in {program}: {m}")
            hypothesis.event(f"eager raised {type(error).__name__}")
            return
        lazy.run(ins, check)
    xlakit.mark_step()
    check()


# -- loops: a replayed step must behave as a freshly recorded one -------------------------
# The engine reuses a loop's recording from its third run on, at the latest its fourth in a fresh
# process (engine/tape.py): each op is
# checked against the op recorded at its place last time, not traced again. A loop whose Python
# scalars, dtypes or layouts change at a later step must then give eager's values and eager's
# errors, as the same step recorded fresh would.
LOOP_STEPS = 7
loop_instructions = st.one_of(
    binary, unary, scalar, matmul, center, inplace, view_inplace, index_put, cast, item, partial_sync, relayout,
    half_scalar, mask_read,
    # good input until the loop's change makes it bad (changed). No integer division: the state's
    # values differ from eager's in the last bits after a step, and a cast to int64 amplifies that
    st.tuples(st.just("bad_index"), st.sampled_from(INDEXING), slot,
              st.lists(st.integers(0, 3), min_size=4, max_size=4), st.just(None)),
)
CASTS = [torch.float64, torch.bfloat16, torch.float16]
HALVES = [torch.float16, torch.bfloat16]


def changed(ins, change: str, new):
    """`ins` after the loop's change: its Python scalars, its dtype, or (layout) as it was."""
    kind, *a = ins
    if change == "scalars":
        unit_value, bad, half_value = new
        if kind in ("scalar", "inplace", "view_inplace", "index_put"):
            return (kind, *a[:-1], unit_value)
        if kind == "bad_index":
            return (kind, *a[:-1], bad)
        if kind == "half_scalar":
            return (kind, *a[:-1], half_value)
        if kind == "mask_read":  # the other positions padded: the other branch, where it was all ones
            return (kind, a[0], [1 - v for v in a[1]], a[2])
    if change == "dtype":
        if kind == "cast":
            return (kind, a[0], CASTS[(CASTS.index(a[1]) + 1) % len(CASTS)])
        if kind == "half_scalar":
            return (kind, a[0], HALVES[1 - HALVES.index(a[1])], *a[2:])
    return ins


def _loop_body(program, state, lazy: bool):
    """The program over the state tensors, whose last results are then written into the state in
    place (bounded by tanh), as a training step updates its parameters. Returns the Program: its
    pool holds every value the step made, as a loop body's locals do at its step marker (a value
    nothing holds at the sync is not computed, nor checked: docs/bad_input.md)."""
    run = Program(list(state), lazy=lazy)
    for ins in program:
        run.run(ins, lambda: None)
    with torch.no_grad():
        for s, new in zip(state, reversed(run.pool[len(state):])):
            s.copy_(new.tanh())
    return run


def _loop_step(program, state, lazy: bool):
    """One step of the loop, ended by its step marker (always this one: the sync its runs follow)."""
    run = _loop_body(program, state, lazy)
    if lazy:
        xlakit.mark_step()
    return run.items


def _fresh_step(program, state, dev):
    """The same step on copies of the state (host tensors: its values before the step), recorded
    fresh: after another sync than the loop's, whose runs the tape has not seen. The copies are
    moved to the device, so that they are the user's tensors as the loop's state is (what a failed
    step gives back depends on it). Returns the type of the error the step raised, and per state
    tensor its value after the step, or the error."""
    copies = [t.to(dev) for t in state]
    xlakit.mark_step()  # the loop's last run ends here: it has no next step
    raised = None
    try:
        run = _loop_body(program, copies, lazy=True)
        xlakit.mark_step()
        del run
    except (IndexError, RuntimeError) as error:
        raised = type(error)
    outcome = []
    for t in copies:
        try:
            outcome.append(t.cpu())
        except (IndexError, RuntimeError) as error:
            outcome.append(type(error))
    return raised, outcome


@settings(max_examples=max(EXAMPLES // 4, 10), deadline=None, derandomize=not RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), program=st.lists(loop_instructions, min_size=1, max_size=16),
       change_at=st.integers(4, LOOP_STEPS - 1), change=st.sampled_from(["scalars", "dtype", "layout"]),
       new=st.tuples(unit, maybe_bad, st.sampled_from([65536.0, 1e-8, 1e5, 3e-5, 7.0])))
def test_random_loops_replayed_after_a_change_match_eager(dev, seed, program, change_at, change, new):
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(SHAPE, generator=gen) for _ in range(3)]
    xlakit.reset()  # each loop as in a fresh process: the last example's runs at this sync back the tape off
    eager, lazy = [t.clone() for t in start], [t.to(dev) for t in start]
    replayed = ops = 0
    for step in range(LOOP_STEPS):
        body = [changed(ins, change, new) for ins in program] if step >= change_at else program
        if change == "layout" and step == change_at:  # the state transposed in memory from here on
            eager, lazy = [t.t().contiguous().t() for t in eager], [t.t().contiguous().t() for t in lazy]
        before = [t.cpu() for t in lazy]  # reads of computed values record no op: the run still replays
        # each step from the state xlakit's last step left, eager's strides kept: a step is held to
        # its own rounding, not to the drift of the steps before it, which a later half cast or
        # cancellation amplifies past any tolerance (an XLA function an ulp off eager's, as its
        # division by a scalar was: the next step's bf16 cast of it moved to the next value)
        with torch.no_grad():
            for e, b in zip(eager, before):
                e.copy_(b)
        try:
            want_items = _loop_step(body, eager, lazy=False)
        except (IndexError, RuntimeError) as error:  # bad input after the change: eager stops here
            with pytest.raises((IndexError, RuntimeError)) as raised:
                _loop_step(body, lazy, lazy=True)
            lazy_error = raised.type, str(raised.value)
            # the error dropped, as its user drops it: its traceback's frames hold the failed run's
            # tensors (made after the bad op: eager never made them), in cycles only the collector frees
            del raised
            gc.collect()
            fresh_error, fresh = _fresh_step(body, before, dev)
            # the error of the first bad op eager ran, or of another a read in the step computed
            # first (a partial sync computes only what it reads): as the step recorded fresh raises
            assert lazy_error[0] is fresh_error, (step, body, lazy_error, fresh_error, error)
            # each state tensor as the same step recorded fresh leaves it: its value, or poisoned
            # (test_a_write_after_a_failed_check_that_does_not_read_it_is_dropped says which)
            for k, (got, want) in enumerate(zip(lazy, fresh)):
                try:
                    host = got.cpu()
                except (IndexError, RuntimeError) as poisoned:
                    assert want is type(poisoned), (k, step, body, want)
                    continue
                assert isinstance(want, torch.Tensor), (k, step, body, want)
                torch.testing.assert_close(host, want, rtol=0, atol=0, equal_nan=True,
                                           msg=lambda m: f"state {k} after the failed step {step} of {body}: {m}")
            hypothesis.event(f"eager raised {type(error).__name__} after the change")
            return
        with xlakit.capture() as records:
            got_items = _loop_step(body, lazy, lazy=True)
        if 3 <= step < change_at:  # the steps the tape may replay before the change
            replayed += sum(r.replay.replayed for r in records if r.replay is not None)
            ops += sum(r.replay.replayed + r.replay.recorded for r in records if r.replay is not None)
        for k, (got, want) in enumerate(zip(lazy, eager)):
            assert got.stride() == want.stride(), (k, step, body)
            torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=2e-3, equal_nan=True,
                                       msg=lambda m: f"state {k} after step {step} of {body}: {m}")
        torch.testing.assert_close(torch.tensor(got_items), torch.tensor(want_items), rtol=2e-2, atol=2e-3,
                                   equal_nan=True)
    assert replayed or not ops, "the loop's steps before the change replayed their recording"


# -- torch.compile: what a program holds of a compiled function's inputs across its calls ------
# A compiled function that updates its input in place donates the input's old buffer when no
# other tensor holds it (engine/compiled.py): every snapshot, clone, view and alias the program
# keeps must read eager's values after every later call.
HOLDS = {
    "clone": lambda x: x.clone(),
    "detach_clone": lambda x: x.detach().clone(),
    "copy_into": lambda x: torch.empty_like(x).copy_(x),
    "alias": lambda x: x,
    "detach": lambda x: x.detach(),
    "row_view": lambda x: x[1],
    "t_view": lambda x: x.t(),
    "flat_view": lambda x: x.view(-1)[2:7],
    "contiguous": lambda x: x.contiguous(),
    "reshape_copy": lambda x: x.t().reshape(-1),
}
compiled_actions = st.one_of(
    st.tuples(st.just("call"), st.sampled_from([0.5, -0.9])),  # Dynamo traces each float again: two graphs
    st.tuples(st.just("hold"), st.sampled_from(list(HOLDS))),
    st.tuples(st.just("drop"), st.integers(0, 7)),
    st.tuples(st.just("write_held"), st.integers(0, 7), unit),   # an in-place write through what is held
    st.tuples(st.just("mark_step")),
)


def _update(x, c):
    x.mul_(c).add_(1)
    return x.sum()


_COMPILED_UPDATE = None


@settings(max_examples=max(EXAMPLES // 4, 10), deadline=None, derandomize=not RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), actions=st.lists(compiled_actions, min_size=1, max_size=24))
def test_what_a_program_holds_of_a_compiled_functions_input_keeps_eagers_values(dev, seed, actions):
    global _COMPILED_UPDATE
    if _COMPILED_UPDATE is None:  # one compiled function for every example: Dynamo traces it once
        _COMPILED_UPDATE = torch.compile(_update, backend="xlakit")
    x0 = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))
    eager, lazy = x0.clone(), x0.to(dev)
    held_eager, held_lazy = [], []
    for action in actions:
        kind, *a = action
        if kind == "call":
            want, got = _update(eager, a[0]), _COMPILED_UPDATE(lazy, a[0])
            torch.testing.assert_close(got.cpu(), want, rtol=2e-4, atol=2e-4, msg=lambda m: f"{actions}: {m}")
        elif kind == "hold":
            held_eager.append(HOLDS[a[0]](eager))
            held_lazy.append(HOLDS[a[0]](lazy))
        elif kind == "drop" and held_eager:
            del held_eager[a[0] % len(held_eager)], held_lazy[a[0] % len(held_lazy)]
        elif kind == "write_held" and held_eager:
            k = a[0] % len(held_eager)
            held_eager[k].add_(a[1])
            held_lazy[k].add_(a[1])
        elif kind == "mark_step":
            xlakit.mark_step()
        for k, (got, want) in enumerate(zip([lazy, *held_lazy], [eager, *held_eager])):
            torch.testing.assert_close(got.cpu(), want, rtol=2e-4, atol=2e-4,
                                       msg=lambda m: f"tensor {k} after {action} in {actions}: {m}")
