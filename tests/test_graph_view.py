"""The step graph's views: the static SVG laid out by Graphviz `dot` (grouped by
module, closed groups beyond a budget, marks), its fallback where `dot` is
missing, the widget's data, and the committed JavaScript bundle."""
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import xlakit  # noqa: E402
from xlakit.notebook import graph_dot, graph_model, graph_widget, views  # noqa: E402
from programs import SHAPES, llama_record, module_chain  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (make graphviz)")


def mlp_steps(dev, steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 4).to(dev), torch.randn(32, 1).to(dev)
    with xlakit.capture() as records:
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            xlakit.mark_step()
    return records


def classes(svg: str) -> list[str]:
    return [c.replace("&#45;", "-") for c in re.findall(r'<g id="\w+" class="([^"]*)"', svg)]


@needs_dot
def test_a_small_step_shows_every_node_in_clusters_by_module(dev, monkeypatch):
    record = mlp_steps(dev)[-1]
    narrow = graph_dot.step_svg(record)  # all open, it is 1439 pt wide: a page would show 6 px text
    assert 'data-grouped="true"' in narrow
    assert float(re.search(r'width="([\d.]+)pt"', narrow)[1]) <= graph_dot.PAGE_WIDTH_PT
    monkeypatch.setattr(graph_dot, "PAGE_WIDTH_PT", float("inf"))
    graph_dot._LAST.clear()
    svg = graph_dot.step_svg(record)
    assert svg.startswith("<svg") and 'data-layout="dot"' in svg and 'data-grouped="false"' in svg
    boxes = [c for c in classes(svg) if "xlakit-node" in c]
    assert len(boxes) == len(record.graph.nodes) + len(record.graph.params)
    clusters = re.findall(r'<g id="clust\d+" class="cluster[^"]*">\s*<title>[^<]*</title>.*?<text[^>]*>([^<]*)</text>',
                          svg, re.S)
    assert {"0", "1", "2", "backward", "optimizer"} <= set(clusters)
    donated = [c for c in boxes if "donated" in c.split()]
    assert len(donated) == len(record.donated) > 0 and all("input" in c.split() for c in donated)
    assert sum("output" in c.split() for c in boxes) == len({r.node for r in record.graph.roots})


@needs_dot
def test_a_llama_step_opens_grouped_by_module_within_the_budget(dev, monkeypatch):
    pytest.importorskip("transformers")
    record = llama_record(layers=2)
    view = graph_model.of_record(record)
    boxes, _ = graph_model.visible(view, view.expanded)
    assert len(record.graph.nodes) > graph_model.BUDGET and len(boxes) <= graph_model.BUDGET
    names = {view.groups[g].name for g in view.expanded}
    assert {"", "model", "model.layers", "backward", "optimizer"} <= names
    closed = [view.groups[b[1]].name for b, _ in boxes if b[0] == "group"]
    assert any(name.startswith("model.layers.") for name in closed)
    monkeypatch.setattr(graph_dot, "PAGE_WIDTH_PT", float("inf"))  # dot draws the view as the widget opens it
    svg = graph_dot.to_svg(view, record.graph)
    assert 'data-grouped="true"' in svg
    assert sum("group" in c.split() for c in classes(svg)) == len(closed)
    # every node is in one box: shown, or counted in its closed group's box
    counted = sum(len([k for k in view.members(b[1]) if view.items[k].kind == "node"])
                  for b, _ in boxes if b[0] == "group")
    shown = sum(1 for b, _ in boxes if b[0] == "item" and view.items[b[1]].kind == "node")
    assert counted + shown == len(record.graph.nodes)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_20000_node_graph_opens_folded_at_every_depth_within_the_budget(shape):
    graph = module_chain(SHAPES[shape])
    view = graph_model.build(graph)
    assert all(len(g.items) <= graph_model.MAX_CHILDREN and len(g.groups) <= graph_model.MAX_GROUPS
               for g in view.groups)
    assert sorted(view.members(0)) == list(range(len(view.items)))
    boxes, _ = graph_model.visible(view, view.expanded)
    assert len(boxes) <= graph_model.BUDGET  # the flat root alone was 5000 boxes
    groups = graph_dot.groups_html(view)
    assert groups.count("<tr>") <= graph_dot.MAX_ROWS and "the interactive view shows them" in groups
    if shutil.which("dot"):
        svg = graph_dot.to_svg(view, graph)
        assert len(re.findall(r'class="node xlakit&#45;node', svg)) <= graph_model.BUDGET
        assert float(re.search(r'width="([\d.]+)pt"', svg)[1]) <= graph_dot.PAGE_WIDTH_PT


@needs_dot
def test_a_llama_steps_static_drawing_is_as_wide_as_a_page_with_every_group_below_it(dev):
    pytest.importorskip("transformers")
    record = llama_record(layers=2)
    page = graph_dot.step_html(record)
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert float(re.search(r'width="([\d.]+)pt"', svg)[1]) <= graph_dot.PAGE_WIDTH_PT  # it was 10101 pt
    assert 'style="max-width:none"' in svg  # a page shows it at its size: 12 px text
    for name in ("model.layers.0.self_attn", "backward.model.layers.1.mlp", "optimizer"):
        assert f"<summary>{name}: " in page
    assert "%0 " in page  # the first node's row, in its group's table


def test_changed_nodes_are_the_ones_inserted_not_all_after_them(dev):
    def step(extra):
        x = torch.arange(8.0).to(dev)
        y = x.sin()
        if extra:
            y = y * 2
        y = y.cos().exp().sum()
        xlakit.mark_step()
        del y
        return xlakit.last_step()

    before, after = step(False), step(True)
    changed = graph_model.changed_nodes(after.graph, before.graph)
    assert [after.graph.nodes[i].op for i in sorted(changed)] == ["aten.mul.Tensor"]
    assert graph_model.changed_nodes(before.graph, before.graph) == set()
    view = graph_model.of_record(after, before)
    assert [item.op for item in view.items if item.changed] == ["aten.mul.Tensor"]


def test_a_step_cut_by_item_marks_its_outputs_as_the_split(dev):
    x = torch.arange(4.0).to(dev)
    total = (x * 3).sum().item()
    record = xlakit.last_step()
    assert record.trigger == "item" and total == 18.0
    view = graph_model.of_record(record)
    assert [item.op for item in view.items if item.split] == ["aten.sum.default"]


def test_without_dot_the_own_layout_draws_it(dev, monkeypatch):
    record = mlp_steps(dev, steps=1)[-1]
    monkeypatch.setenv("PATH", "")
    svg = graph_dot.step_svg(record)
    assert 'data-layout="fallback (no dot executable)"' in svg and 'class="xlakit-graph"' in svg
    assert svg.count('class="xlakit-node') == len(record.graph.nodes) + len(record.graph.params)


def test_a_5000_node_graph_without_modules_is_grouped_by_line_then_runs(dev):
    x = torch.ones(8).to(dev)
    for _ in range(2500):
        x = x * 1.0001
        x = x + 0.5
    xlakit.mark_step()
    record = xlakit.last_step()
    view = graph_model.of_record(record)
    boxes, edges = graph_model.visible(view, view.expanded)
    assert len(record.graph.nodes) == 5000 and len(boxes) <= graph_model.BUDGET
    assert all(len(g.items) <= graph_model.MAX_CHILDREN for g in view.groups)
    assert sorted(view.members(0)) == list(range(len(view.items)))
    lines = sorted(g.label for g in view.groups if g.parent == 0)
    assert lines[0] == "inputs" and len(lines) == 3 and all("test_graph_view.py:" in label for label in lines[1:])
    if shutil.which("dot"):
        assert 'data-grouped="true"' in graph_dot.to_svg(view, record.graph)


def test_the_widget_gets_the_view_as_plain_data(dev):
    records = mlp_steps(dev)
    record = records[-1]
    data = graph_widget.to_json(graph_model.of_record(record, records[0]))
    assert json.loads(json.dumps(data)) == data
    nodes = [i for i in data["items"] if i["kind"] == "node"]
    assert len(nodes) == len(record.graph.nodes) and 0 in data["expanded"]
    # the groups the first view opened, in order: the widget closes the last where its canvas is small
    assert {0, *(g for unit in data["opened"] for g in unit)} == set(data["expanded"])
    mm = next(i for i in nodes if i["op"] == "aten.mm.default")
    assert mm["module"].startswith("backward.") and mm["hlo"] and mm["user"].startswith("test_graph_view.py:")
    assert any(i.get("changed") for i in nodes)  # the second step has the momentum buffers
    assert sum(bool(i.get("donated")) for i in data["items"]) == len(record.donated)
    widget = graph_widget.GraphWidget(graph=data)
    assert widget.graph["items"] == data["items"] and Path(graph_widget.BUNDLE).is_file()


def test_the_step_widget_has_the_interactive_graph_in_its_graph_tab(dev):
    records = mlp_steps(dev)
    widget = views.StepView(records[-1], "cell", records[0]).widget()
    assert widget.sections[0] == ["Graph", None]  # its tab draws `graph`, not the static SVG
    assert widget.graph == graph_widget.to_json(graph_model.of_record(records[-1], records[0]))


def _sources_digest(js: Path) -> str:
    """js/build.mjs's digest of its inputs (the same bytes, the same order)."""
    digest = hashlib.sha256()
    files = ["build.mjs", "package.json", "package-lock.json",
             *sorted(f"src/{p.name}" for p in (js / "src").iterdir())]
    for name in files:
        digest.update(name.encode() + b"\0" + (js / name).read_bytes() + b"\0")
    return digest.hexdigest()


def test_the_committed_bundle_was_built_from_the_committed_sources():
    banner = graph_widget.BUNDLE.read_text().split("\n", 1)[0]
    assert banner.endswith(f"sources digest {_sources_digest(ROOT / 'js')}"), \
        "xlakit/notebook/static/graph.js is stale: run `make js` and commit it"


@pytest.mark.skipif(shutil.which("node") is None or not (ROOT / "js" / "node_modules").is_dir(),
                    reason="node and js/node_modules (make js) are needed to rebuild the bundle")
def test_the_bundle_rebuilds_byte_for_byte(tmp_path):
    out = tmp_path / "graph.js"
    subprocess.run(["node", "build.mjs", str(out)], cwd=ROOT / "js", check=True, capture_output=True)
    assert out.read_bytes() == graph_widget.BUNDLE.read_bytes()
