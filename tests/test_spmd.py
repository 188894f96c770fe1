"""Many devices (issue 17): meshes, shardings in the key and the records, sharded
training equal to eager, donation of sharded buffers, the 2-process run, and
the same sharded program on torch_xla.

The 8-device cases (tests/spmd_cases.py) run in one worker process whose JAX
starts with 8 CPU host devices: XLA_FLAGS is read once, when JAX starts, and
the rest of the suite keeps its one device. What one device can show runs here.
"""
import importlib.util
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xlakit
from xlakit.analysis import executable
from xlakit.notebook import sharding_view

HERE = Path(__file__).resolve().parent


def _eight_devices() -> None:
    """The worker's initializer: before its JAX starts."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()


def _run_case(name: str, *args):
    import spmd_cases

    return getattr(spmd_cases, name)(*args)


@pytest.fixture(scope="module")
def case():
    """case(name, *args): spmd_cases.<name>(*args) on 8 devices; its result, or its error."""
    pool = multiprocessing.get_context("spawn").Pool(1, initializer=_eight_devices)
    try:
        yield lambda name, *args: pool.apply_async(_run_case, (name, *args)).get(timeout=900)
    finally:
        pool.terminate()
        pool.join()


# -- 8 devices ------------------------------------------------------------------------
def test_mlp_data_parallel_and_weight_sharded_equal_eager_with_less_memory_per_device(case):
    one = case("mlp_on_one_device")
    data = case("mlp_data_parallel")
    fsdp = case("mlp_weight_sharded")
    assert one["devices"] == 1 and data["devices"] == fsdp["devices"] == 8
    # sharded weights and optimizer state: each device holds an eighth of them
    assert fsdp["arguments"] < data["arguments"] / 4, (fsdp, data)
    assert fsdp["peak"] < data["peak"] / 2, (fsdp, data)
    assert data["arguments"] <= one["arguments"]  # the batch is split too


@pytest.mark.parametrize("layout", ["data", "fsdp"])
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_transformers_model_trains_sharded_as_eager(case, model, layout):
    pytest.importorskip("transformers")
    result = case("transformer", model, layout)
    assert result["devices"] == 8 and "all-reduce" in result["collectives"]
    if layout == "fsdp":
        assert "all-gather" in result["collectives"]  # weights gathered where they are used


def test_a_sharding_only_change_is_a_miss_that_says_what_changed(case):
    why = case("sharding_only_change_is_a_miss")["why"]
    assert why[0] == "input 0 (w) sharding now ('data', None), was one device"


def test_the_sharded_cost_line_compares_the_whole_program_with_xlas_count_times_the_devices(case):
    cost = case("sharded_cost")
    assert cost["devices"] == 8 and cost["estimate"] > 2 * 64 * 64 * 64   # the whole matmul, counted once
    whole = cost["xla_per_device"] * 8
    ratio = cost["estimate"] / whole
    assert 0.9 < ratio < 1.1, (cost["estimate"], cost["xla_per_device"])  # a split matmul: like with like
    assert f"{ratio:.0%} of XLA's count for the whole program: " in cost["html"], cost["html"]
    assert " per device x 8 devices = " in cost["html"], cost["html"]


def test_sharded_buffers_are_donated_at_step_markers_only(case, tmp_path):
    case("donation_at_step_markers_only", str(tmp_path / "t1.pt"))


def test_reads_of_sharded_values_gather_them(case):
    case("reads_gather_sharded_values")


def test_sharding_view_draws_each_tensor_on_the_device_grid(case):
    case("views")


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed")
def test_the_same_sharded_program_on_torch_xla(case):
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"}
    done = subprocess.run([sys.executable, str(HERE / "spmd_torch_xla.py")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = case("mlp_for_torch_xla")
    # the same values
    torch.testing.assert_close(ours["losses"], theirs["losses"], rtol=1e-5, atol=1e-7)
    for name, value in theirs["params"].items():
        torch.testing.assert_close(torch.tensor(ours["params"][name]), torch.tensor(value), rtol=1e-5, atol=1e-6)
    # the marked tensors lie the same way: each device holds the same piece
    for name in ("0.weight", "2.weight", "x"):
        assert ours["shards"][name] == {int(d): s for d, s in theirs["shards"][name].items()}, name
    assert ours["specs"] == {"0.weight": "('model', None)", "0.bias": "replicated", "2.weight": "(None, 'model')",
                             "x": "('data', None)"}
    # torch_xla's propagation split the unmarked bias too, so its second step had new
    # input shardings and compiled again; xlakit keeps an updated parameter as it was
    assert theirs["specs"]["0.bias"].startswith("{devices=[4,2]")
    assert ours["compiles"] == 1 and theirs["compiles"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_data_parallel_as_eager(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLAKIT_CACHE_DIR"] = ""  # two processes, one program: no shared disk cache to race on
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    logs = [open(tmp_path / f"process{i}.err", "w") for i in range(2)]
    processes = [subprocess.Popen([sys.executable, str(HERE / "spmd_multiprocess.py"), str(i), str(port)],
                                  env=env, stdout=subprocess.PIPE, stderr=logs[i], text=True) for i in range(2)]
    try:
        outputs = [p.communicate(timeout=420)[0] for p in processes]
    finally:
        for p in processes:  # bounded: whatever still runs stops here
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    errors = [(tmp_path / f"process{i}.err").read_text()[-2000:] for i in range(2)]
    assert [p.returncode for p in processes] == [0, 0], errors
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert [r["process"] for r in results] == [0, 1]
    assert set(results[0]["local_devices"]).isdisjoint(results[1]["local_devices"])
    for r in results:
        torch.testing.assert_close(r["losses"], r["eager_losses"], rtol=1e-5, atol=1e-7)
        assert r["params_equal"] and r["gathered_equal"], r
        # each process keeps its own StepRecords of the one SPMD program
        steps = r["records"][:3]
        assert [s["cache"] for s in steps][2:] == ["hit"] and {s["devices"] for s in steps} == {8}
        assert all(s["mesh"] == [8] and "all-reduce" in s["collectives"] for s in steps)
    assert results[0]["records"] == results[1]["records"]


# -- one device ------------------------------------------------------------------------
def test_a_step_on_one_device_has_no_shardings(dev):
    y = torch.arange(4.0).to(dev).square().sum()  # a graph of its own (others' tests expect their misses)
    xlakit.mark_step()
    record = xlakit.last_step()
    assert record.shardings is None and record.collectives == ()
    assert "shardings" in record.components and record.graph.params[0].sharding == "one device"
    assert record.memory is None or record.memory.devices == 1
    assert "sharding:" not in repr(record)
    assert repr(xlakit.sharding_view(record)) == f"sharding of step {record.index}: one device, nothing sharded"
    assert y.item() == 14


def test_a_mesh_of_one_device_changes_the_key_and_says_why(dev):
    import jax

    mesh = xlakit.Mesh((1,), ("data",), devices=jax.devices()[:1])
    xlakit.clear_cache()
    host = torch.arange(8.0).reshape(4, 2)
    records = []
    for spec in (None, ("data", None), ("data", None)):
        w = xlakit.label(host.to(dev), "w")
        if spec is not None:
            xlakit.mark_sharding(w, mesh, spec)
        out = w.exp().sum(dim=1)
        xlakit.mark_step()
        records.append(xlakit.last_step())
        torch.testing.assert_close(out.cpu(), host.exp().sum(dim=1))
    one, meshed, again = records
    assert meshed.changed == ("shardings",) and meshed.why == ("input 0 (w) sharding now ('data', None), "
                                                              "was one device",)
    assert again.cache == "hit" and again.key == meshed.key
    assert meshed.shardings.mesh.shape == (1,) and meshed.memory.devices == 1


def test_mesh_and_spec_mistakes_are_clear(dev):
    with pytest.raises(ValueError, match=r"needs 1024 devices, jax.devices\(\) has \d+"):
        xlakit.Mesh((32, 32), ("data", "model"))
    with pytest.raises(ValueError, match="need as many distinct names"):
        xlakit.Mesh((1, 1), ("data", "data"))
    mesh = xlakit.Mesh((1,), ("data",))
    t = torch.ones(3, 2).to(dev)
    with pytest.raises(ValueError, match=r"'model' is not an axis of the mesh \('data',\)"):
        xlakit.mark_sharding(t, mesh, ("model", None))
    with pytest.raises(ValueError, match=r"has 1 entries for a tensor of 2 dims"):
        xlakit.mark_sharding(t, mesh, ("data",))
    with pytest.raises(ValueError, match=r"mesh axis \['data'\] used twice"):
        xlakit.mark_sharding(t, mesh, ("data", "data"))
    with pytest.raises(ValueError, match="move it with"):
        xlakit.mark_sharding(torch.ones(2), mesh, (None,))
    assert t.sum().item() == 6  # the session goes on


# Optimized HLO as XLA prints it: jax 0.10's mesh notation, jax 0.7's iota and explicit groups,
# a combined all-reduce with a long tuple, and an asynchronous pair (TPU, GPU).
HLO = """
  %all-reduce = f32[] all-reduce(%multiply_reduce_fusion), channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, use_global_device_ids=true, to_apply=%region
  %all-gather.2 = f32[8,16]{0,1} all-gather(%copy.2), channel_id=5, replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, dimensions={1}
  %all-reduce.1 = f32[] all-reduce(%all-reduce), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true
  %reduce-scatter = bf16[4,8]{1,0} reduce-scatter(%p), channel_id=3, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %all-reduce.7 = (f32[256,16]{1,0}, f32[8]{0}, f32[2]{0}, f32[], f32[], /*index=5*/f32[16]{0}) all-reduce(%dot.3, %d), channel_id=7, replica_groups=[1,8]<=[8]
  %collective-permute = f32[1,2,8]{2,1,0} collective-permute(%c), channel_id=4, source_target_pairs={{0,0},{4,1},{1,2},{5,3}}
  %all-gather-start = (f32[2,16]{1,0}, f32[16,16]{1,0}) all-gather-start(%p1), channel_id=8, replica_groups=[1,8]<=[8], dimensions={0}
  ROOT %all-gather-done = f32[16,16]{1,0} all-gather-done(%all-gather-start)
  %fusion = f32[16,16]{1,0} fusion(%all-gather-done), kind=kLoop, calls=%fused_computation
"""


def test_collectives_are_read_from_optimized_hlo():
    found = executable.collectives(HLO)
    assert [(c.op, c.name, c.nbytes, c.group_size) for c in found] == [
        ("all-reduce", "all-reduce", 4, 4),
        ("all-gather", "all-gather.2", 512, 4),
        ("all-reduce", "all-reduce.1", 4, 2),
        ("reduce-scatter", "reduce-scatter", 64, 4),
        ("all-reduce", "all-reduce.7", 4 * (256 * 16 + 8 + 2 + 1 + 1 + 16), 8),
        ("collective-permute", "collective-permute", 64, 4),
        ("all-gather", "all-gather-done", 1024, None),  # the -done has no groups; its -start is not counted
    ]


def test_device_grid_of_a_split_over_two_axes():
    from xlakit.core.record import MeshInfo

    mesh = MeshInfo(shape=(2, 4), axis_names=("data", "model"), devices=(0, 1, 2, 3, 4, 5, 6, 7))
    assert sharding_view.blocks(mesh, (("data",), (), ("model",))) == {
        (0, 0, k): [k] for k in range(4)} | {(1, 0, k): [4 + k] for k in range(4)}
    # a dim over two axes is cut major axis first: block 2 * model + data
    assert sharding_view.blocks(mesh, ((), ("model", "data"))) == {
        (0, 2 * m + d): [4 * d + m] for d in range(2) for m in range(4)}
    assert sharding_view.blocks(mesh, ((), ())) == {(0, 0): list(range(8))}
    assert sharding_view.pieces(mesh, (("data",), ("model",))) == (2, 4)


def test_bad_sharding_specs_are_clear_errors(case):
    errors = case("bad_sharding_specs")
    line = r"\(the tensor f32\[8, ?8\], at spmd_cases\.py:\d+\)$"
    assert set(errors) == {"repeated in one entry", "a bare string", "a bool entry", "a bool inside an entry",
                           "a bool spec", "None inside an entry", "an axis past the mesh"}
    assert re.search(r"mesh axis \['data'\] used twice in \(\('data', 'data'\), None\).*" + line,
                     errors["repeated in one entry"])
    assert re.search(r"the spec 'data' is not a tuple of one entry per dim: write \('data',\) ",
                     errors["a bare string"])
    assert re.search(r"True is not an axis of the mesh \('data', 'model'\) \(in the spec \(True, None\)\).*" + line,
                     errors["a bool entry"])
    assert "False is not an axis" in errors["a bool inside an entry"]
    assert "the spec True is not a tuple" in errors["a bool spec"]
    assert "None is not an axis" in errors["None inside an entry"]
    assert re.search(r"2 is not an axis of .* \(in the spec \(2, None\)\).*its index \(0 to 1\)", errors["an axis past the mesh"])


def test_a_compiled_training_step_keeps_each_parameters_sharding(case):
    result = case("compiled_step_keeps_shardings")
    assert all(specs == result["before"] for specs in result["after"]), result
    assert result["before"]["2.weight"] == "('data', None)", result["before"]
    compiles = result["compiles"]
    assert compiles[3] == compiles[2] == compiles[1], compiles  # from the third call on, nothing is compiled
