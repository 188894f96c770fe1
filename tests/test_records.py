"""StepRecord's typed fields: enums equal to the strings users compare with, None for unknowns."""
import dataclasses

import pytest
import torch

import xlakit
from xlakit.core.record import Backend, Cache, Output, Trigger


def test_trigger_cache_and_backend_are_enums_equal_to_their_strings(dev):
    x = torch.arange(4.0).to(dev)
    with xlakit.capture() as steps:
        (x * 7 - 2).sum().item()
        (x * 7 - 2).sum().item()
    first, second = steps
    assert first.trigger is Trigger.ITEM and first.trigger == "item" and f"{first.trigger}" == "item"
    assert first.cache in (Cache.MISS, Cache.PERSISTENT_HIT) and second.cache is Cache.HIT == "hit"
    assert first.backend is Backend.XLAKIT and first.backend == "xlakit"
    assert first.metadata_digest is not None and first.donated_bytes == 0


def test_operands_and_roots_are_typed_and_equal_to_pairs(dev):
    x = torch.ones(3).to(dev)
    y = (x + 1) * 2
    xlakit.mark_step()
    graph = xlakit.last_step().graph
    mul = next(n for n in graph.nodes if "mul" in n.op)
    assert Output(0, 0) in mul.operands and (0, 0) in mul.operands
    assert all(isinstance(o, (int, Output)) for n in graph.nodes for o in n.operands)
    assert graph.roots[0] == (1, 0) and graph.roots[0].node == 1 and graph.roots[0].output == 0
    assert graph.params[0].aval == "f32[3]"
    del y


def test_explains_fx_partition_is_a_field_of_its_own():
    def f(x):
        return torch.angle(x.sin() - 1).sum()

    report = xlakit.explain(f, torch.randn(4))
    compiled = report.fx_graphs[0].compiled
    graph = compiled.graph
    assert [n.partition for n in graph.nodes] == list(compiled.partition.values())
    assert all(n.avals and "executable" not in ",".join(n.avals) for n in graph.nodes)
    assert graph.params[0].aval == "f32[4]" and graph.params[0].label is not None


def test_torch_xla_unknowns_are_none():
    torch_xla = pytest.importorskip("torch_xla")
    from xlakit.integrations import torch_xla as adapter

    w = torch.ones(5).to(torch_xla.device())
    torch_xla.sync()
    w.mul_(3)
    record = adapter.step()
    assert record.backend is Backend.TORCH_XLA and record.trigger is Trigger.MARK_STEP
    assert record.metadata_digest is None and record.hlo is None and record.uses is None
    assert record.hit_rate is None and record.cache_entries is None
    assert all(d.index is None and d.nbytes is None for d in record.donated)
    assert record.donated_bytes is None if record.donated else record.donated_bytes == 0
    assert w.cpu().tolist() == [3.0] * 5


def test_memory_and_cost_come_from_the_compiled_executable(dev):
    w = torch.randn(64, 32).to(dev)
    x = torch.randn(16, 64).to(dev)
    xlakit.mark_step()
    w.add_(1.0)                  # w's buffer is overwritten: donated into the new w
    y = x @ w
    xlakit.mark_step()
    record = xlakit.last_step()
    memory, cost = record.memory, record.cost
    f32 = 4
    assert memory.arguments == (64 * 32 + 16 * 64 + 1) * f32           # the 1.0 is an input too
    roots = (64 * 32 + 16 * 32) * f32
    assert roots <= memory.outputs <= roots + 8 * record.num_outputs    # and XLA's output tuple
    assert memory.aliased == record.donated_bytes == 64 * 32 * f32
    assert memory.peak >= memory.arguments + memory.outputs - memory.aliased
    assert memory.devices == 1 and memory.device_limit is None   # the CPU says no limit
    assert cost.flops >= 2 * 16 * 64 * 32 and cost.bytes_accessed >= memory.arguments
    torch.testing.assert_close(y.cpu(), x.cpu() @ w.cpu())


def test_each_replay_of_a_compiled_graph_has_a_record_of_its_own(dev):
    # a replay's record copies the previous replay's (StepRecord.rerun): the executable's
    # graph and key are shared, the run's own fields are its own, earlier records stay as they were
    torch._dynamo.reset()
    compiled = torch.compile(torch.nn.Linear(4, 2).to(dev), backend="xlakit")
    x = torch.randn(3, 4).to(dev)
    with torch.no_grad(), xlakit.capture() as steps:
        for _ in range(4):
            compiled(x)
    replays = [r for r in steps if r.trigger == "compiled"]
    assert len(replays) >= 3, steps
    first = replays[0]
    assert [r.index for r in replays] == list(range(first.index, first.index + len(replays)))
    assert [r.uses for r in replays] == list(range(first.uses, first.uses + len(replays)))
    assert all(r.cache is Cache.HIT and r.key == first.key and r.graph is first.graph for r in replays)
    assert all(r.timings.execute > 0 and r.profile is None for r in replays)
    assert "cache hit" in repr(replays[-1])
    torch._dynamo.reset()


def test_rerun_copies_a_record_with_the_fields_given(dev):
    x = torch.ones(3).to(dev)
    (x + 1).sum().item()
    record = xlakit.last_step()
    again = record.rerun(index=record.index + 1, uses=7)
    assert (again.index, again.uses, again.graph, again.key) == (record.index + 1, 7, record.graph, record.key)
    assert record.uses != 7 and dataclasses.replace(again, why=("w",)).why == ("w",)
    with pytest.raises(TypeError, match="no field usage"):
        record.rerun(usage=7)


def test_a_name_given_again_names_the_buffer_and_a_named_clone_leaves_its_source_s(dev):
    w = xlakit.label(torch.ones(3).to(dev), "w")
    w.mul_(2)
    xlakit.mark_step()
    snapshot = xlakit.label(w.clone(), "snapshot")  # holds w's buffer until either is written
    (w * snapshot).sum().item()
    assert [p.label for p in xlakit.last_step().graph.params] == ["w"]
    xlakit.label(w, "weight")
    (w * 3).sum().item()
    assert [p.label for p in xlakit.last_step().graph.params] == ["weight"]
    w.add_(1)
    xlakit.mark_step()
    record = xlakit.last_step()
    labels = [p.label for p in record.graph.params]
    assert "weight" in labels and "snapshot" not in labels and not record.donated  # the clone holds it
    assert snapshot.cpu().tolist() == [2.0] * 3 and w.cpu().tolist() == [3.0] * 3
