"""The stages of a sync called one by one: cut and plan are plain functions of
the pending IR (no JAX), the key is computed from the planned graph."""
import torch

import xlakit
from xlakit.engine import executor, keys, stages
from xlakit.front import recorder


def pending(dev):
    """Two buffers, a weight updated in place and a gradient-like output of the same shape."""
    w = torch.ones(4, device=dev)
    x = torch.full((4,), 2.0, device=dev)
    xlakit.mark_step()
    g = x * 3           # an output of w's shape, computed first
    w.add_(g)           # w's own update
    value = recorder.unwrap(w)._state
    return w, x, g, value


def live():
    return executor.current().live_values()


def test_cut_takes_the_graph_of_the_targets(dev):
    w, x, g, value = pending(dev)
    cut = stages.cut([value], live(), full=True)
    assert [str(n.op) for n in cut.graph.nodes] == ["aten.mul.Tensor", "aten.add.Tensor"]
    assert cut.roots == [(value.node, value.index)]


def test_plan_donates_only_at_step_markers_and_pairs_a_donor_with_its_own_update(dev):
    w, x, g, value = pending(dev)
    gv = recorder.unwrap(g)._state
    value.label = "w"  # as labels.py stamps a parameter's name on its value before a step marker
    cut = stages.cut([gv, value], live(), full=True)
    partial = stages.plan(cut, live(), full=False, donate=True)
    assert partial.donors == () and partial.note == "partial sync: never donates"
    assert partial.graph is cut.graph
    # x is still held by a live tensor; w's old buffer is not (w now points at its update)
    params = cut.graph.params
    w_index = next(i for i, p in enumerate(params) if p is not recorder.unwrap(x)._state.data)
    params[w_index].label = "w"  # the old buffer carries its tensor's name
    full = stages.plan(cut, live(), full=True, donate=True)
    assert full.donors == (w_index,)
    assert "still referenced by live tensors" in full.note
    # w's update is moved first, so JAX pairs the donor with it, not with g's output
    assert full.roots[0] == (value.node, value.index)
    assert cut.graph.roots != full.graph.roots and cut.roots == [(gv.node, gv.index), (value.node, value.index)]
    # the key is computed from the planned graph: donors and root order are in it
    flags = {"f": "1"}
    assert keys.compute_key(full.graph, full.donors, flags).key != keys.compute_key(cut.graph, (), flags).key
    off = stages.plan(cut, live(), full=True, donate=False)
    assert off.donors == () and "turned off" in off.note


def test_plan_pairs_each_donor_with_the_update_made_from_it_without_labels(dev):
    # under torch.compile nothing names a function's parameters: donors were paired by shape alone,
    # so a weight's buffer could go to another tensor's update of its shape (and its sharding with
    # it, sharding.plan), and a loop's key changed once names arrived
    a, b = torch.ones(4, device=dev), torch.full((4,), 2.0, device=dev)
    xlakit.mark_step()
    a_old, b_old = (recorder.unwrap(t)._state.data for t in (a, b))
    b.mul_(3).add_(1)        # b's update, recorded first (its buffer is the graph's first input)
    a.lerp_(b, 0.5)          # a's, which reads b's update too
    values = [recorder.unwrap(t)._state for t in (a, b)]  # a's output first: shape pairing crosses them
    cut = stages.cut(values, live(), full=True)
    index = {id(p): i for i, p in enumerate(cut.graph.params)}
    assert index[id(b_old)] < index[id(a_old)]  # the scalars 3, 1 and 0.5 are inputs too (read-only)
    assert [stages.updated_from(*root, index) for root in cut.roots] == [index[id(a_old)], index[id(b_old)]]
    planned = stages.plan(cut, live(), full=True, donate=True)
    assert planned.donors == (index[id(b_old)], index[id(a_old)])
    # JAX pairs donors with outputs in order: each old buffer with its own tensor's update
    paired = dict(zip(planned.donors, planned.roots))
    assert paired[index[id(a_old)]] == cut.roots[0] and paired[index[id(b_old)]] == cut.roots[1]
    assert cut.labels == [None, None] and a_old.label is None and b_old.label is None


# -- the one donation rule, on plain values: the scenarios of lazy steps and compiled calls ----
def _buffer(read_only=False):
    import jax.numpy as jnp
    from xlakit.core.ir import Aval, DeviceData
    return DeviceData(jnp.zeros(4), Aval((4,), torch.float32), read_only=read_only)


class _Held:
    """A live tensor's value holding `data` (stages.holders reads only that)."""
    def __init__(self, data):
        self.data = data


def _why(buffer, holding, *, read=(), kept_by_update):
    return stages.why_not_donated(buffer, stages.holders([_Held(d) for d in holding], {id(b) for b in read}),
                                  kept_by_update=kept_by_update)


def test_one_rule_decides_what_lazy_steps_and_compiled_calls_donate():
    w, snapshot_source, host_copy = _buffer(), _buffer(), _buffer(read_only=True)
    # the seed's donor scenario: w updated in place, its tensor holds the pending update
    assert _why(w, [], kept_by_update=0) is None
    # the save scenario: a tensor saved before the update (or a view's base) still holds w's buffer
    assert _why(w, [w], kept_by_update=0) == stages.STILL_HELD
    # a compiled call updates its input in place: the input's tensor holds the buffer, and may
    assert _why(w, [w], kept_by_update=1) is None
    # ... but not while a snapshot (x.clone(): the same value, another tensor) holds it too
    assert _why(w, [w, w], kept_by_update=1) == stages.STILL_HELD
    # pending work outside the call reads it, or the call is fed it twice
    assert _why(w, [w], read=[w], kept_by_update=1) == stages.STILL_READ
    # a host input's device copy, kept for the next call, and constants: never
    assert _why(host_copy, [], kept_by_update=0) == stages.READ_ONLY
    # another buffer's holders do not count
    assert _why(w, [snapshot_source, snapshot_source], kept_by_update=1) is None
