"""xlakit.profile(): a step's executable measured with JAX's profiler and joined to the
nodes, modules and lines that made each op; the step itself as without profiling."""
import copy
import html
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from conftest import assert_same  # noqa: E402

import xlakit  # noqa: E402
from xlakit.engine.executor import current  # noqa: E402

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def llama():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg), torch.randint(0, 64, (4, 16))  # matmuls outweigh XLA's copies


def adamw_steps(model, ids, steps: int, sync, profile_at: int | None = None):
    """`steps` AdamW steps; the one numbered `profile_at` inside xlakit.profile(runs=5).
    Returns the profiled step's records and the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    profiled, losses = [], []
    for i in range(steps):
        with xlakit.profile(runs=5) if i == profile_at else xlakit.capture() as records:
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            sync()
        losses.append(loss.detach())
        if i == profile_at:
            profiled = records
    return profiled, losses


def test_a_profiled_llama_step_is_joined_to_its_modules_and_keeps_its_values(dev):
    model, ids = llama()
    lazy = copy.deepcopy(model).to(dev)
    before = xlakit.metrics()
    steps, losses = adamw_steps(lazy, ids.to(dev), 4, xlakit.mark_step, profile_at=2)
    _, want_losses = adamw_steps(model, ids, 4, lambda: None)

    # profiling left the step alone: a cache hit that donated, values as eager's after it
    rec, = steps
    assert rec.cache == "hit" and rec.donated and xlakit.last_step().key == rec.key
    assert xlakit.metrics()["executions"] - before["executions"] == 4
    for got, want in zip(losses, want_losses):
        assert_same(got, want, rtol=1e-4, atol=1e-5)
    for p, q in zip(lazy.parameters(), model.parameters()):
        assert_same(p, q.detach(), rtol=1e-4, atol=1e-5)

    profile = rec.profile
    assert profile is not None and profile.runs == 5 and profile.platform == "cpu"
    assert profile.device_seconds > 0 and profile.overhead_seconds > 0
    assert profile.coverage >= 0.75  # the rest is XLA's own copies, whose share moves with load (notebooks/05)
    # forward, backward and optimizer paths, each with measured time
    modules = profile.by_module
    assert modules["model.layers.0.self_attn.q_proj"] > 0
    assert modules["backward.model.layers.1.mlp.down_proj"] > 0
    assert modules["optimizer"] > 0
    assert sum(modules.values()) == pytest.approx(profile.op_seconds)
    assert sum(op.seconds for op in profile.ops) == pytest.approx(profile.op_seconds)
    # every op names its nodes or says it is XLA's own
    hlo = rec.hlo
    for op in profile.ops:
        assert f"%{op.hlo_op} = " in hlo
        assert bool(op.nodes) != bool(op.xla_own), op
        assert op.split == (len(op.nodes) > 1)
        assert all(0 <= n < rec.num_nodes for n in op.nodes)
    # XLA's copies of inputs name the input
    labels = {p.label for p in rec.graph.params}
    copies = [op for op in profile.ops if op.xla_own.startswith("a copy XLA made of input")]
    assert copies and all(op.xla_own.split("(")[-1].rstrip(")") in labels for op in copies)
    # the joins agree with the graph: a forward matmul's op is its node's, with its module and line
    q_proj = next(op for op in profile.ops if op.module == "model.layers.0.self_attn.q_proj" and op.flops > 0)
    assert any("mm" in rec.graph.nodes[n].op and rec.graph.nodes[n].module == q_proj.module for n in q_proj.nodes)
    assert "modeling_llama.py" in str(q_proj.source.library)
    assert q_proj.bytes > 0
    assert any(op.split for op in profile.ops)  # fusions of several nodes share their time
    assert "test_profile.py" in next(iter(profile.by_line))


def test_profiling_does_not_count_as_an_execution_of_the_cached_executable(dev):
    x = torch.ones(64, 64).to(dev)
    for _ in range(2):
        x = (x @ x).tanh()
        xlakit.mark_step()
    first = xlakit.last_step()
    with xlakit.profile(runs=3) as steps:
        x = (x @ x).tanh()
        xlakit.mark_step()
    rec, = steps
    assert rec.key == first.key and rec.cache == "hit" and rec.uses == first.uses + 1
    assert current().cache.get(rec.key).uses == rec.uses
    ops = {op.opcode for op in rec.profile.ops}
    assert ops & {"dot", "fusion"}
    assert rec.profile.coverage == pytest.approx(1.0)
    assert_same(x, _eager_chain(3))


def _eager_chain(steps: int) -> torch.Tensor:
    x = torch.ones(64, 64)
    for _ in range(steps):
        x = (x @ x).tanh()
    return x


def test_profile_blocks_do_not_nest_and_want_a_run(dev):
    with pytest.raises(ValueError, match="at least one run"):
        with xlakit.profile(runs=0):
            pass
    with xlakit.profile():
        with pytest.raises(RuntimeError, match="do not nest"):
            with xlakit.profile():
                pass
    assert current().profiling is None


def test_steps_outside_a_profile_block_are_not_profiled(dev):
    x = torch.ones(4).to(dev) + 1
    xlakit.mark_step()
    assert xlakit.last_step().profile is None


def test_a_torch_compile_graph_replayed_on_device_buffers_is_profiled(dev):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(eager).to(dev)
    compiled = torch.compile(model, backend="xlakit")
    x = torch.randn(3, 8)
    # inference runs at each call; a training forward would wait for its step (docs/views.md)
    with torch.no_grad():
        for _ in range(2):
            compiled(x.to(dev))
        with xlakit.profile() as steps:
            got = compiled(x.to(dev))
    replayed = [r for r in steps if r.trigger == "compiled"]
    assert replayed and all(r.cache == "hit" and r.profile is not None for r in replayed)
    profile = replayed[-1].profile
    # a graph this small is mostly XLA's own copies on some versions (jax 0.7.2: 40-60%)
    assert profile.coverage > 0 and {"0", "2"} <= profile.by_module.keys()
    assert all(bool(op.nodes) != bool(op.xla_own) for op in profile.ops)
    assert_same(got.detach(), eager(x).detach())
    with torch.no_grad():
        compiled(x.to(dev))  # after the block: its record copies the last replay's, not the profiled one
    assert xlakit.last_step().trigger == "compiled" and xlakit.last_step().profile is None
    torch._dynamo.reset()


def test_xla_step_profile_shows_a_profile_tab(shell):
    from test_notebook import run

    run(shell, "%%xla_step --name prof\npx = torch.ones(32, 32).to(dev)\npy = (px @ px).relu().sum()")
    texts, htmls, result = run(shell, "%%xla_step --name prof --profile --profile-runs 2\n"
                                      "px = torch.ones(32, 32).to(dev)\npy = (px @ px).relu().sum()")
    assert result.success
    rec = xlakit.last_step()
    assert rec.cache == "hit" and rec.profile is not None and rec.profile.runs == 2
    assert "<h4>Profile</h4>" in htmls[0] and "Time by module" in htmls[0]


def test_the_profile_tab_shows_modules_lines_and_the_slowest_ops_with_their_hlo(dev):
    from xlakit.notebook import profile_view, render
    from xlakit.notebook.views import StepView

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32).to(dev)
    for i in range(3):
        with xlakit.profile() if i == 2 else xlakit.capture() as steps:
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            xlakit.mark_step()
    rec = steps[-1]
    page = render.html_view(rec)
    assert "<script" not in page
    tab = profile_view.profile_html(rec)
    # the module tree, measured: forward, backward and the optimizer, each with a bar
    for name in ("backward", "optimizer", "0", "2"):
        assert f'">{name}</span>' in tab
    assert "Time by line" in tab and "test_profile.py" in tab
    # the slowest op: its name, its HLO line on hovering, its nodes' ops
    slowest = rec.profile.ops[0]
    assert f">{slowest.hlo_op}</td>" in tab
    hlo_line = next(line for line in rec.hlo.splitlines() if line.strip().startswith(f"%{slowest.hlo_op} = ")
                    or line.strip().startswith(f"ROOT %{slowest.hlo_op} = "))
    assert f'title="{html.escape(hlo_line.strip().split(", metadata=")[0])}"' in tab
    # a timeline: each phase starts where the one before ended, named as the Cache and time tab names it
    for phase in ("trace", "lower", "compile", "execute", "device"):
        assert f"<td>{phase}</td>" in tab
    t = rec.timings
    execute_starts = profile_view._us(t.trace + t.lower + t.compile)
    assert tab.count(f'<td class="num">{execute_starts}</td>') >= 2  # execute and the device's run
    assert "<td>run</td>" not in tab
    assert "FLOP/s" in tab and "B/s" in tab
    # the roofline picture: a point per op with FLOPs, its name and intensity on hovering
    with_flops = [op for op in rec.profile.ops if op.flops > 0 and op.bytes > 0]
    assert tab.count('fill-opacity="0.7"><title>') == len(with_flops) >= 2
    assert f"<title>{with_flops[0].hlo_op} [" in tab
    # its axes: a tick and a grid line at each power of ten, every point inside the frame
    roofline = tab[tab.index('<svg class="xlakit-roofline"'):]
    frame = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" fill="none"', roofline)
    x0, y0, w, h = map(float, frame.groups())
    for cx, cy in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', roofline):
        assert x0 <= float(cx) <= x0 + w and y0 <= float(cy) <= y0 + h
    assert roofline.count('class="grid"') >= 4 and "FLOP/s</text>" in roofline and "FLOPs per byte" in roofline
    assert "Profile" in [title for title, _ in StepView(rec).widget().sections]
    # an unprofiled step has no Profile tab
    assert profile_view.sections(xlakit.steps()[-2]) == []


def test_a_trace_already_running_is_a_warning_and_the_step_keeps_its_values(dev, tmp_path):
    import jax

    from xlakit.engine.profiling import ProfilingWarning

    x = torch.ones(8).to(dev)
    jax.profiler.start_trace(str(tmp_path))
    try:
        with pytest.warns(ProfilingWarning, match="could not be profiled: another JAX profiler trace is running"):
            with xlakit.profile() as steps:
                y = x * 4
                xlakit.mark_step()
    finally:
        jax.profiler.stop_trace()
    assert steps[0].profile is None and y.cpu().tolist() == [4.0] * 8


def test_another_threads_steps_are_not_profiled(dev):
    import threading

    def other():
        z = torch.ones(5).to(dev) * 7
        xlakit.mark_step()
        done.append((xlakit.last_step(), z))

    done = []
    with xlakit.profile() as steps:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        y = torch.ones(6).to(dev) * 2
        xlakit.mark_step()
    (theirs, z), = done
    assert theirs.profile is None and z.cpu().tolist() == [7.0] * 5
    assert [r.profile is not None for r in steps] == [True]


# a matmul (%0) whose result a loop fusion only transposes: the fusion holds the mm's scope on its
# bitcast and transpose, as XLA:CPU's optimized HLO of a Llama step's backward does
_MATMUL_THEN_TRANSPOSE = """HloModule jit_step



%fused_computation (param_0: f32[64,64]) -> f32[64,64] {
  %param_0 = f32[64,64]{1,0} parameter(0)
  %bitcast.2 = f32[64,64]{1,0} bitcast(%param_0)
  ROOT %transpose.3 = f32[64,64]{1,0} transpose(%bitcast.2), dimensions={1,0}
}

ENTRY %main (a: f32[64,32], b: f32[32,64]) -> f32[64,64] {
  %a = f32[64,32]{1,0} parameter(0)
  %b = f32[32,64]{1,0} parameter(1)
  %dot.1 = f32[64,64]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %copy_fusion = f32[64,64]{1,0} fusion(%dot.1), kind=kLoop, calls=%fused_computation
}
"""


def test_an_instruction_that_only_moves_a_matmuls_result_gets_none_of_its_flops(dev):
    """The roofline's 1.1-1.6 TFLOP/s points on a 2-core CPU were partly fusions that transpose a
    matmul's result: given half its FLOPs over their short time (a 55 us copy at 610 GFLOP/s)."""
    import dataclasses

    from xlakit.analysis import profile
    from xlakit.core.record import GraphInfo, NodeInfo, ParamInfo

    with xlakit.capture() as steps:
        y = torch.randn(64, 32).to(dev) @ torch.randn(32, 64).to(dev)  # noqa: F841 - kept: the step computes it
        xlakit.mark_step()
    graph = GraphInfo(nodes=(NodeInfo("aten.mm.default", (0, 1), ("f32[64,64]",), None, args="$0, $1",
                                      hlo_ops=("dot.1", "bitcast.2", "transpose.3")),),
                      params=(ParamInfo("f32[64,32]", None, False), ParamInfo("f32[32,64]", None, False)),
                      roots=((0, 0),))
    rec = dataclasses.replace(steps[-1], graph=graph, hlo=_MATMUL_THEN_TRANSPOSE)
    measured = profile.join(rec, {"dot.1": 1e-3, "copy_fusion": 5e-5}, device_seconds=1.05e-3, runs=1,
                            overhead_seconds=0.0, platform="cpu")
    flops = {op.hlo_op: op.flops for op in measured.ops}
    assert flops == {"dot.1": 2 * 64 * 32 * 64, "copy_fusion": 0.0}
    assert {op.hlo_op: op.nodes for op in measured.ops} == {"dot.1": (0,), "copy_fusion": (0,)}


def test_an_asynchronous_matmul_on_the_host_gets_the_idle_time_while_its_work_ran():
    """XLA:CPU's dot thunk hands its work to Eigen's pool: its event ends at the handing over,
    and the next op starts once the work is done (two 134 MFLOP dots: 253 us events, then 1.35 ms
    of nothing: read alone, 530 GFLOP/s each on a 2-core CPU)."""
    from types import SimpleNamespace as Event

    from xlakit.engine import profiling

    def event(op, start_us, duration_us):
        return Event(stats=[("hlo_op", op), ("hlo_module", "jit_step"), ("run_id", 7)],
                     start_ns=start_us * 1000, duration_ns=duration_us * 1000)

    events = [event("fusion.1", 0, 100), event("dot.1", 100, 250), event("dot.2", 350, 250),
              event("fusion.2", 1950, 50)]
    data = Event(planes=[Event(name="/host:CPU", lines=[Event(name="tf_XLAEigen/1", events=events)])])
    seconds, device = profiling._per_run(data, "jit_step", 1, {"dot.1", "dot.2"})
    assert seconds == pytest.approx({"fusion.1": 100e-6, "dot.1": 925e-6, "dot.2": 925e-6, "fusion.2": 50e-6})
    assert device == pytest.approx(2000e-6)
