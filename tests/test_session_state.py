"""Session state shared across calls: per-thread captures, the bound on unread checks."""
import threading

import pytest
import torch
from conftest import assert_same

import xlakit
from xlakit.engine.check_results import UNREAD_LIMIT
from xlakit.engine.executor import current


def test_capture_collects_only_its_own_threads_steps(dev):
    barrier = threading.Barrier(2, timeout=60)
    captured, errors = {}, []

    def worker(name, scale):
        try:
            x = torch.full((3,), float(scale)).to(dev)
            with xlakit.capture() as steps:
                barrier.wait()                   # both captures are open
                for _ in range(scale):
                    x = x + 1
                    (x * 2).sum().item()
                barrier.wait()                   # both threads' syncs ran while both were open
                with xlakit.capture() as inner:  # nesting still works per thread
                    x.sum().item()
            captured[name] = (steps, inner)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(name, n)) for name, n in (("a", 2), ("b", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    (a, a_inner), (b, b_inner) = captured["a"], captured["b"]
    assert [r.trigger for r in a] == ["item"] * 3 and [r.trigger for r in b] == ["item"] * 4
    assert not {r.index for r in a} & {r.index for r in b}
    assert a_inner == a[-1:] and b_inner == b[-1:]


@pytest.mark.parametrize("bad_at", [0, 100])
def test_unread_checks_stay_bounded_and_an_early_bad_index_still_raises(dev, monkeypatch, bad_at):
    monkeypatch.setattr(xlakit.config, "wait_for_execution", False)
    ledger = current()._ledger  # its bound is what this checks
    table = torch.arange(5.0).to(dev)
    good, wrong = torch.tensor([1]).to(dev), torch.tensor([7]).to(dev)
    total, totals, most = torch.zeros(()).to(dev), [], (0, 0)
    for step in range(300):   # each step has a check (the gather's index); none is read, all are kept
        if step == bad_at:
            bad = table[wrong] * 2   # this step's check fails
        total = total + table[good].sum()
        totals.append(total)
        xlakit.mark_step()
        most = max(most[0], len(ledger.steps)), max(most[1], len(ledger.waiting))
    assert most[0] <= UNREAD_LIMIT and most[1] <= 2 * UNREAD_LIMIT, most
    # read early (past UNREAD_LIMIT), the failed check is raised at the next read
    with pytest.raises(IndexError, match="^index 7 is out of bounds for dimension 0 with size 5"):
        bad.cpu()
    with pytest.raises(IndexError, match="could not be computed"):
        bad.cpu()
    assert_same(total, torch.tensor(300.0))
    assert_same(totals[bad_at], torch.tensor(bad_at + 1.0))


def test_a_step_marker_leaves_the_collector_as_found_and_no_collection_walks_its_nodes(dev, monkeypatch):
    """The collector is off from the marker's sync until its graph is dropped (Engine.mark_step):
    the step's nodes die by reference counting, before any collection could walk them; a user's
    choice to keep it off stands."""
    import gc

    from xlakit.core.ir import Node

    x = torch.ones(64).to(dev)
    walked, threshold = [], gc.get_threshold()

    def watch(phase, info):
        if phase == "start":
            walked.append(sum(type(o) is Node for o in gc.get_objects(generation=0)))

    compute = type(current())._compute

    def collecting_soon(*args, **kwargs):  # from inside the sync: any allocation once the collector is on collects
        gc.set_threshold(1)
        return compute(*args, **kwargs)

    monkeypatch.setattr(type(current()), "_compute", collecting_soon)
    for step in range(3):  # recorded, then replayed
        gc.collect()
        gc.set_threshold(1 << 30)  # the step's nodes stay young, as between two collections
        try:
            y = x
            for _ in range(50):
                y = y * 1.5 + 1
            gc.callbacks.append(watch)
            xlakit.mark_step()
            assert gc.isenabled()
            gc.collect(0)
        finally:
            if watch in gc.callbacks:
                gc.callbacks.remove(watch)
            gc.set_threshold(*threshold)
        assert walked and max(walked) == 0, (step, walked)
        walked.clear()
    eager = torch.ones(64)
    for _ in range(50):
        eager = eager * 1.5 + 1
    assert_same(y, eager)
    gc.disable()
    try:
        (x * 2).sum()
        xlakit.mark_step()
        assert not gc.isenabled()
    finally:
        gc.enable()
