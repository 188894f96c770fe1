"""torch.compile(backend="xlakit") and xlakit.explain: exact break counts, checked by hand."""
import copy
import os
import re

import pytest
import torch
import torch.nn.functional as F

import xlakit
from xlakit.integrations import dynamo
from xlakit.notebook import breaks_view


def messy(x):
    y = x.sin() * 2
    if y.sum() > 0:                   # +2: data-dependent branch
        y = y + 1
    print(y.mean())                   # +4: print
    nz = torch.nonzero(y > 1.5)       # +5: data-dependent output shape
    z = F.interpolate((y - 1).view(1, 1, 2, 4), size=(2, 3), mode="bilinear", antialias=True)  # +6: no lowering
    return z.sum() + nz.sum()


LINE = messy.__code__.co_firstlineno
AA = "aten._upsample_bilinear2d_aa"  # antialiased resize: no XLA lowering in xlakit or torch_xla
HERE = "test_graph_breaks.py"


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_clean_mlp_has_one_graph_and_no_break_on_every_path():
    report = xlakit.explain(mlp(), torch.randn(3, 4))
    assert len(report.paths) >= 3
    for path in report.paths:
        assert (path.graphs, path.breaks) == (1, 0), path
    assert report.ops_per_graph == [["linear", "relu", "linear"]]
    assert report.breaks == [] and "ran the function once per path" in repr(report)
    # Dynamo's graph grouped by module path (nn_module_stack), its inputs named by their module
    graph = report.fx_graphs[0].graph
    assert [(n.op, n.module) for n in graph.nodes] == [("linear", "0"), ("relu", "1"), ("linear", "2")]
    assert sorted(p.label for p in graph.params) == ["0.bias", "0.weight", "2.bias", "2.weight", "args_0"]


def test_messy_function_counts_per_path():
    torch.manual_seed(0)
    x = torch.randn(8)
    assert messy(x).item() == pytest.approx(messy(x).item())  # deterministic input for all paths
    report = xlakit.explain(messy, x)

    fx = report.path("Dynamo FX")
    assert (fx.graphs, fx.breaks) == (4, 3)
    assert [w.split(":")[1] for w in fx.why] == [str(LINE + 2), str(LINE + 4), str(LINE + 5)]

    compiled = report.path("Dynamo -> HLO (xlakit backend)")
    # FX graphs: [sin mul sum gt], [mean], [gt], [sub view resize sum sum add] -> the last splits at the resize
    assert (compiled.graphs, compiled.breaks) == (5, 1)
    assert compiled.why == [f"FX graph 3: {AA}.default ({AA[5:]}) fallback at {HERE}:{LINE + 6} "
                            "(runs eagerly on CPU: no XLA lowering)"]
    last = report.fx_graphs[3]
    assert last.ops == ["sub", "view", "interpolate", "sum", "sum", "add"]
    assert last.compiled.partition == {"sub": 0, "view": 0, AA[5:]: 1, "sum_1": 1, "sum_2": 1, "add": 1}
    assert [g.compiled.executables for g in report.fx_graphs] == [1, 1, 1, 2]

    lazy = report.path("Lazy (xlakit engine)")
    assert (lazy.graphs, lazy.breaks) == (5, 4)
    assert lazy.why == [f"item at {HERE}:{LINE + 2}", f"cpu at {HERE}:{LINE + 4}",
                        f"fallback at {HERE}:{LINE + 5} (aten.nonzero.default)",
                        f"fallback at {HERE}:{LINE + 6} ({AA}.default)"]

    if any(p.path.startswith("torch_xla") for p in report.paths):
        lazy_xla = report.path("torch_xla LazyTensor")
        assert (lazy_xla.graphs, lazy_xla.breaks) == (5, 4)
        assert lazy_xla.why[:3] == ["CPU fallback aten::_local_scalar_dense x1", "CPU fallback aten::_upsample_bilinear2d_aa x1",
                                    "CPU fallback aten::nonzero x1"]
        openxla = report.path("torch_xla openxla")
        assert openxla.why[0] == "CPU fallback aten::_upsample_bilinear2d_aa x1"


def test_each_break_carries_its_source_dynamo_explanation_and_the_graphs_on_either_side():
    torch.manual_seed(0)
    report = xlakit.explain(messy, torch.randn(8))
    branch, printed, nonzero = report.breaks
    assert [(b.where.line, b.before, b.after) for b in report.breaks] == [(LINE + 2, 0, 1), (LINE + 4, 1, 2),
                                                                          (LINE + 5, 2, 3)]
    # the source around the line, read through linecache
    assert branch.lines[0] == (LINE - 1, "") and branch.lines[3] == (LINE + 2, "    if y.sum() > 0:                   # +2: data-dependent branch")
    assert [n for n, _ in branch.lines] == list(range(LINE - 1, LINE + 6))
    # Dynamo's own words: a bare "generic_jump" reason gets its type, code and hints from Dynamo's registry
    assert branch.reason.startswith("generic_jump") and branch.dynamo.code == "GB0170"
    assert branch.dynamo.title == "Data-dependent branching" and "Use `torch.cond` to express dynamic control flow." in branch.dynamo.hints
    assert printed.dynamo.code == "GB0059" and "`print`" in printed.dynamo.explanation
    assert nonzero.dynamo.title == "Dynamic shape operator" and nonzero.dynamo.context == "aten.nonzero.default"
    assert any("capture_dynamic_output_shape_ops" in h for h in nonzero.dynamo.hints)
    # and plain words for what the code did, Dynamo's name beside them
    branching = ("an `if` (or `while`) on a tensor's value: Python needs the value, so the graph ends to compute it "
                 "(Dynamo: Data-dependent branching (GB0170))")
    assert report.path("Dynamo FX").why[0] == f"{HERE}:{LINE + 2}: {branching}"
    assert f"break 1 at {HERE}:{LINE + 2} (after FX graph 0, before FX graph 1): {branching}" in repr(report)
    assert printed.dynamo.plain.startswith("a call of Python's `print`, which Dynamo cannot put in a graph")
    assert nonzero.dynamo.plain == "`aten.nonzero.default`'s output shape depends on the tensor's values, unknown until it runs"
    # the raw reason stays in the view, after the plain words
    html = breaks_view.reason_html(branch)
    assert html.index("an `if` (or `while`)") < html.index("Data-dependent branching") < html.index("generic_jump")
    # the graphs on either side of the nonzero break: [gt] before it, the split graph after it
    assert report.fx_graphs[nonzero.before].ops == ["gt"] and report.fx_graphs[nonzero.after].compiled.splits


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).relu()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.encoder(x)
        print("encoded")                  # a break between the encoder and the head
        return self.head(h).sin()


def test_fx_graphs_group_nodes_by_module_and_draw_as_the_step_view_does():
    torch.manual_seed(0)
    report = xlakit.explain(Net(), torch.randn(3, 4))
    (b,) = report.breaks
    before, after = report.fx_graphs[b.before], report.fx_graphs[b.after]
    assert [(n.op, n.module) for n in before.graph.nodes] == [
        ("linear", "encoder.0.proj"), ("relu", "encoder.0"), ("linear", "encoder.1.proj"), ("relu", "encoder.1")]
    assert [(n.op, n.module) for n in after.graph.nodes] == [("linear", "head"), ("sin", "")]
    assert "encoder.0.proj.weight" in [p.label for p in before.graph.params]
    assert after.graph.nodes[0].source.user.line == Net.forward.__code__.co_firstlineno + 3
    # the step view's dot SVG: module groups as clusters, and the aten graph grouped by executable
    page = report._repr_html_()
    assert page.count("<details class='xlakit-break'>") == 1 and page.count("class='xlakit-fx-graph'") == 2
    if 'data-layout="dot"' in page:  # Graphviz installed: module groups are its clusters
        clusters = re.findall(r'<g id="clust\d+" class="cluster[^"]*">\s*<title>[^<]*</title>.*?<text[^>]*>([^<]*)</text>',
                              page, re.S)
        assert {"encoder", "0", "1", "proj", "head", "executable 0"} <= set(clusters)
    assert "executable 0" in page and "<span class='at'>" in page and "GB0059" in page
    # the widget: a row per break (closed), each holding the step view's graph widgets
    widget = report.widget()
    rows = widget.children[2]
    assert rows.selected_index is None and rows.get_title(0).startswith("break 1 at")
    tabs = rows.children[0].children[1]
    graph = tabs.children[0].graph
    assert [g["name"] for g in graph["groups"]][:3] == ["", "encoder", "encoder.0"]
    assert {i["title"] for i in graph["items"] if i["kind"] == "node"} == {"%0 linear", "%1 relu", "%2 linear", "%3 relu"}
    compiled = breaks_view.by_executable(before.compiled)
    assert {n.module.split(".")[0] for n in compiled.nodes} == {"executable 0"}


def test_compiled_and_lazy_results_equal_eager(dev):
    torch.manual_seed(1)
    x = torch.randn(8)
    want = messy(x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(messy, backend="xlakit")(x), want)
    got = messy(x.to(dev))
    assert torch.allclose(got.cpu(), want)


def test_training_step_through_torch_compile_matches_eager():
    torch._dynamo.reset()
    model = mlp()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="xlakit")
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    x, y = torch.randn(6, 4), torch.randn(6, 2)
    with dynamo.compiled_graphs() as graphs, xlakit.capture() as steps:
        for _ in range(3):
            for m, o in ((compiled, opt), (ref, ref_opt)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    assert len(graphs) == 2 and all(g.replays and not g.splits for g in graphs)  # forward and backward
    replays = [r for r in steps if r.trigger == "compiled"][-2:]
    assert len(replays) == 2 and all(r.cache == "hit" and r.donated == () for r in replays)


def test_backend_is_found_through_the_entry_point_without_importing_xlakit(new_python):
    program = ("import torch\nf = torch.compile(lambda x: (x * 3).sin(), backend='xlakit')\n"
               "x = torch.arange(4.0)\nassert torch.allclose(f(x), (x * 3).sin())\n"
               "import sys\nprint('xlakit.integrations.dynamo' in sys.modules)")
    done = new_python("-c", program, check=True)
    assert done.stdout.strip() == "True"


def test_compiled_resize_takes_the_indices_it_made_on_the_host_to_the_device():
    # Dynamo traces on host tensors: a bilinear resize's decomposition makes its
    # index tensors with device=cpu; they must join the lazy graph, not mix with it
    def resize(x):
        return F.interpolate((x * 2).view(1, 1, 2, 4), size=(2, 3), mode="bilinear")

    torch._dynamo.reset()
    x = torch.randn(8)
    with xlakit.capture() as steps:
        got = torch.compile(resize, backend="xlakit")(x)
    assert got.device == x.device and len(steps) == 1
    torch.testing.assert_close(got, resize(x))


def test_explain_imports_torch_xla_without_its_device_notice(new_python):
    pytest.importorskip("torch_xla")
    # a fresh process with no PJRT_DEVICE: torch_xla's import picks one and logs it on the root logger
    program = ("import logging, torch, xlakit\n"
               "report = xlakit.explain(lambda x: x.sin(), torch.ones(3))\n"
               "print([p.path for p in report.paths][-1], logging.getLogger().handlers)")
    env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
    done = new_python("-c", program, check=True, env=env, timeout=600)
    assert done.stdout.strip() == "torch_xla openxla []"    # it ran, and left logging as it was
    assert "PJRT_DEVICE" not in done.stderr
