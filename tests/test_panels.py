"""The Memory and Cost panels of a step view: what they read (XLA's memory and cost
analysis, each buffer's size and donation, per-op FLOP estimates by module) and
what they show."""
import dataclasses
import re
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import xlakit
from xlakit.analysis import flops, footprint
from xlakit.core.ir import Aval, DeviceData, Graph
from xlakit.core.record import GraphInfo, NodeInfo, Output, ParamInfo
from xlakit.engine import executables
from xlakit.notebook import panels, render
from xlakit.notebook.units import human_bytes


def conv_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 10))


def test_matmul_and_convolution_flops_are_torchs_count(dev):
    x = torch.randn(4, 3, 6, 6, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        conv_net()(x).square().mean().backward()
    model, lazy_x = conv_net().to(dev), x.detach().to(dev).requires_grad_()
    model(lazy_x).square().mean().backward()   # the gradients stay live: the step computes them
    xlakit.mark_step()
    graph = xlakit.last_step().graph
    counted = {n.op for n in graph.nodes if flops._formula(n.op) is not None}
    assert {"aten.convolution.default", "aten.convolution_backward.default", "aten.mm.default"} <= counted
    ours = sum(flops.node_flops(graph, n) for n in graph.nodes if n.op in counted)
    assert ours == counter.get_total_flops()
    # and the whole step's estimate is near XLA's own count of the compiled program
    assert 0.5 < flops.by_module(graph).flops / xlakit.last_step().cost.flops < 2


def node(op, avals, operands=(), module="", args=""):
    return NodeInfo(op=op, operands=tuple(operands), avals=tuple(avals), source=None, module=module, args=args)


def test_rules_for_ops_without_a_torch_formula():
    params = (ParamInfo("f32[8,4]", "w", False), ParamInfo("f32[4,8]", None, False))
    graph = GraphInfo(nodes=(
        node("aten.mm.default", ["f32[8,8]"], [0, 1], args="$0, $1"),
        node("aten.sum.dim_IntList", ["f32[8]"], [Output(0, 0)], args="$0, [1]"),
        node("aten.exp.default", ["f32[8,8]"], [Output(0, 0)], args="$0"),
        node("aten.view_copy.default", ["f32[64]"], [Output(2, 0)], args="$0, [64]"),
        node("aten.ones.default", ["f32[3]"], args="[3], pin_memory=False"),
        node("aten.mv.default", ["f32[8]"], [0, Output(4, 0)], args="$0, $1"),
        node("aten.mul.Tensor", ["f32[?]"], [Output(0, 0)], args="$0, 2"),
    ), params=params, roots=(Output(3, 0),))
    assert [flops.node_flops(graph, n) for n in graph.nodes] == [
        2 * 8 * 4 * 8,     # torch's mm formula
        64,                # a reduction: one per input element
        64,                # elementwise: one per output element
        0, 0,              # data movement, a factory
        2 * 8 * 4,         # a matmul without a torch formula: 2·m·k
        0,                 # an output shape it cannot read
    ]


def test_transposed_convolution_counts_per_input_element():
    params = (ParamInfo("f32[1,4,5,5]", None, False), ParamInfo("f32[4,2,3,3]", None, False))
    common = "$0, $1, None, [1, 1], [0, 0], [1, 1], {}, [0, 0], 1"
    plain = node("aten.convolution.default", ["f32[1,4,3,3]"], [0, 1], args=common.format(False))
    graph = GraphInfo(nodes=(plain,), params=(params[0], ParamInfo("f32[4,4,3,3]", None, False)), roots=())
    assert flops.node_flops(graph, plain) == 2 * (4 * 3 * 3) * (4 * 3 * 3)
    transposed = node("aten.convolution.default", ["f32[1,2,7,7]"], [0, 1], args=common.format(True))
    graph = GraphInfo(nodes=(transposed,), params=params, roots=())
    assert flops.node_flops(graph, transposed) == 2 * (4 * 5 * 5) * (2 * 3 * 3)


def test_modules_add_up_and_backward_counts_toward_its_module():
    mm = dict(op="aten.mm.default", avals=["f32[4,8]"], operands=[0, 1], args="$0, $1")   # 2*4*8*8 = 512
    add = dict(op="aten.add.Tensor", avals=["f32[4,8]"], operands=[0, 0])                 # 32
    graph = GraphInfo(nodes=(
        node(module="encoder.layer.1", **mm),
        node(module="encoder.layer.0", **mm),
        node(module="encoder.layer.0.attn", **mm),
        node(module="backward.encoder.layer.0.attn", **mm),
        node(module="optimizer", **add),
        node(module="", **add),            # the step's own (the loss)
        node(module="backward", **add),    # the loss's backward
    ), params=(ParamInfo("f32[4,8]", None, False), ParamInfo("f32[8,8]", None, False)), roots=())
    tree = flops.by_module(graph)
    assert (tree.ops, tree.flops, tree.backward) == (7, 4 * 512 + 3 * 32, 512 + 32)
    assert set(tree.children) == {"encoder", "optimizer"}
    layer0 = tree.children["encoder"].children["layer"].children["0"]
    assert (layer0.path, layer0.ops, layer0.flops, layer0.backward) == ("encoder.layer.0", 3, 3 * 512, 512)
    assert layer0.children["attn"].flops == 2 * 512 and layer0.children["attn"].name == "attn"
    assert tree.children["encoder"].flops == 4 * 512
    assert tree.children["optimizer"].flops == 32
    assert flops.by_op(graph)[0] == ("mm", 4, 4 * 512)
    # drawn as a tree: open levels first, each module's share of the whole
    html = panels._tree_html(tree, tree.flops, 0)
    assert html.count("<details") == 4 and "attn" in html     # modules with submodules fold
    assert "2 ops of its own" in html and ", 1 op<" in html
    assert html.index('title="encoder.layer.0"') < html.index('title="encoder.layer.1"')   # a list in its order
    assert "(512 FLOP backward)" in html


def sgd_step(dev, model, data, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        model(data).square().mean().backward()
        opt.step()
        xlakit.mark_step()
    return xlakit.last_step()


def test_a_models_flops_split_by_module(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev)
    record = sgd_step(dev, model, torch.randn(8, 16).to(dev))
    if not any(n.module for n in record.graph.nodes):
        pytest.skip("this build records no module paths (NodeInfo.module)")
    tree = flops.by_module(record.graph)
    first, second = tree.children["0"], tree.children["2"]
    assert first.flops >= 2 * 8 * 16 * 32 * 2 and first.backward >= 2 * 8 * 16 * 32   # forward + weight grad
    assert second.backward >= 2 * 2 * 8 * 32 * 4                                      # its input's and weight's
    assert tree.children["optimizer"].flops > 0 and tree.children["optimizer"].backward == 0
    assert tree.flops >= sum(c.flops for c in tree.children.values())
    html = panels.cost_html(record)
    assert "By module" in html and "optimizer" in html


def test_memory_panel_names_the_largest_buffers_and_their_donation(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).to(dev)
    record = sgd_step(dev, model, torch.randn(8, 64).to(dev))
    memory = record.memory
    weight = 128 * 64 * 4
    # parameters and momentum are donated and come back as outputs written into them
    aliases = footprint.output_aliases(record.hlo)
    assert sorted(aliases.values()) == sorted(d.index for d in record.donated)
    assert memory.aliased == sum(d.nbytes for d in record.donated)
    roles = {role: (count, n) for role, count, n in footprint.by_role(record)}
    assert roles["donated inputs"] == (len(record.donated), record.donated_bytes)
    assert roles["outputs into donated inputs"] == roles["donated inputs"]
    assert sum(n for _, n in roles.values()) <= memory.arguments + memory.outputs
    largest = footprint.largest(record, 4)
    assert all(b.nbytes == weight for b in largest)
    assert {b.label for b in largest} >= {"0.weight", "0.weight.momentum_buffer"}
    new = next(b for b in footprint.buffers(record) if b.label == "0.weight (new value)")
    assert new.kind == "output" and new.note == f"written into input {aliases[new.index]} (donated)"
    html = panels.memory_html(record)
    for shown in ("arguments", "temporaries", "= allocated", "peak", "0.weight.momentum_buffer", "32.0 KiB",
                  "not reported by the device"):
        assert shown in html
    assert "xlakit-warning" not in html
    assert memory.allocated == memory.arguments + memory.outputs - memory.aliased + memory.temporaries + memory.code
    assert memory.peak <= memory.allocated
    text = render.text(record)
    assert f"allocated {human_bytes(memory.allocated)} = arguments {human_bytes(memory.arguments)}" in text
    assert f"memory: peak {human_bytes(memory.peak)} per device" in text
    assert "cost: " in text and "(XLA's estimates)" in text


def test_a_peak_over_the_devices_memory_is_a_visible_warning(dev):
    x = torch.randn(256, 256).to(dev)
    y = x @ x
    xlakit.mark_step()
    record = xlakit.last_step()
    small = dataclasses.replace(record.memory, device_limit=record.memory.peak // 2)
    over = dataclasses.replace(record, memory=small)
    assert 'class="xlakit-warning"' in panels.memory_html(over)
    assert "will likely run out of memory" in render.text(over)
    assert "run out of memory" not in render.text(record)
    assert "written into donated inputs" not in render.text(record)   # nothing was donated
    # the engine's own warning, before the first run, names the user's line, not xlakit's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executables._warn_if_too_big(small, _graph_with_params([x.shape]))
    assert len(caught) == 1 and caught[0].filename == __file__
    assert "more than the device's" in str(caught[0].message)
    del y


def _graph_with_params(shapes):
    """An IR graph whose only content is its inputs (what the warning names)."""
    params = [DeviceData(None, Aval(tuple(s), torch.float32), label=f"input{i}") for i, s in enumerate(shapes)]
    return Graph(nodes=[], params=params, roots=[], wiring=[])


def test_footprint_reads_avals_and_the_alias_map():
    assert footprint.aval_bytes("f32[16,4]") == 256
    assert footprint.aval_bytes("bf16[]") == 2
    assert footprint.aval_bytes("f32[2,3]{1,0}") == 24          # torch_xla's, with a layout
    assert footprint.aval_bytes("float8_e4m3fn[8]") == 8
    assert footprint.aval_bytes(None) is None and footprint.aval_bytes("tuple") is None
    header = ("HloModule jit_f, is_scheduled=true, input_output_alias={ {0}: (2, {}, may-alias), "
              "{3}: (0, {}, must-alias) }, entry_computation_layout={(f32[2]{0})->f32[2]{0}}")
    assert footprint.output_aliases(header + "\n\nENTRY ...") == {0: 2, 3: 0}
    single = "HloModule jit_f, input_output_alias={ {}: (1, {}, may-alias) }, entry_computation_layout={}"
    assert footprint.output_aliases(single) == {0: 1}
    assert footprint.output_aliases("HloModule jit_f, entry_computation_layout={}") == {}
    assert footprint.output_aliases(None) == {}


def test_history_shows_peak_memory(dev):
    from xlakit.notebook.render import history_html, history_text

    y = torch.ones(1000).to(dev) * 2
    xlakit.mark_step()
    record = xlakit.last_step()
    peak = human_bytes(record.memory.peak)
    assert peak in history_text([("cell 1", record)]).splitlines()[1]
    assert f"<td>{peak}</td>" in history_html([("cell 1", record)])
    del y


def test_the_widget_has_a_titled_tab_per_section(dev):
    from xlakit.notebook.views import StepView

    y = torch.ones(4).to(dev) * 2
    xlakit.mark_step()
    sections = StepView(xlakit.last_step()).widget().sections
    assert [title for title, _ in sections] == ["Graph", "Key", "Why", "Donation", "Cache and time", "Memory", "Cost"]
    del y


def _cells(row: str) -> int:
    return row.count("<td") + row.count("<th")


def test_numerics_header_has_a_column_per_row_cell_and_bars_share_one_scale(dev):
    """The header had five columns, the rows six; and each bar was on its own dtype's scale, so an f32
    module 2^121 below overflow drew a bar as long as an f16 one 2^14 below it."""
    import math
    import re

    from xlakit.core.record import ModuleRange, NumericsInfo
    from xlakit.notebook import numerics_view

    y = torch.ones(4).to(dev) * 2
    xlakit.mark_step()
    f32, f16 = torch.finfo(torch.float32), torch.finfo(torch.float16)
    ranges = {"a": ModuleRange(absmax=f32.max / 2 ** 121, dtype="f32", limit=f32.max, tiny=f32.tiny),
              "b": ModuleRange(absmax=f16.max / 2 ** 14, dtype="f16", limit=f16.max, tiny=f16.tiny)}
    record = dataclasses.replace(xlakit.steps()[-1], numerics=NumericsInfo(ranges=ranges))
    page = numerics_view.html_panel(record)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page)
    assert len(rows) == 3 and {_cells(r) for r in rows} == {6}
    # one log2 scale: the bar ends at log2(absmax) on it, whatever the dtype
    low, high = math.log2(f32.tiny), math.log2(f32.max)
    for path, r in ranges.items():
        row = next(row for row in rows if f"<td>{path}</td>" in row)
        x, width = map(float, re.search(r'class="xlakit-bar" x="([\d.]+)" y="2" width="([\d.]+)"', row).groups())
        end = low + (x + width) / numerics_view.BAR_WIDTH * (high - low)
        assert end == pytest.approx(math.log2(r.absmax), abs=0.2)
    assert "the same for every row" in page
    del y


def test_an_unnamed_input_says_what_reads_it(dev):
    """7 of the 10 largest inputs of the quickstart's GPT-2 step showed as "(unnamed)"."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).to(dev)
    data = torch.randn(8, 64).to(dev)
    record = sgd_step(dev, model, data)
    rows = panels.memory_html(record)
    assert "(unnamed)" not in rows
    data_input = next(b for b in footprint.buffers(record) if b.kind == "input" and b.aval == "f32[8,64]")
    assert data_input.label.startswith("unnamed input (data or an earlier step's value), read by %")
    assert " in 0 at " in data_input.label and "test_panels.py" in data_input.label


def test_the_cost_tab_says_the_ranges_check_adds_to_xlas_count(dev, monkeypatch):
    """A 64-64-8 MLP: the estimate is 99% of XLA's count, 66% with --ranges (its checks are XLA's ops)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    x = torch.randn(32, 64).to(dev)
    y = model(x).sum()
    xlakit.mark_step()
    assert "ranges check" not in panels.cost_html(xlakit.last_step())
    monkeypatch.setattr(xlakit.config, "record_ranges", True)
    y = model(x).sum()
    xlakit.mark_step()
    record = xlakit.last_step()
    assert record.numerics.ranges and "XLA's count also holds the ranges check's ops" in panels.cost_html(record)
    del y


def test_why_summarizes_a_long_list_of_donated_inputs():
    """A GPT-2 step's Why tab listed its 80 donated inputs one by one."""
    from xlakit.analysis import misses

    def graph(donated):
        return GraphInfo(nodes=(), params=tuple(ParamInfo("f32[2]", None, i in donated) for i in range(100)),
                         roots=())

    now = {2, 3, 4, 5, 6, 7, 9, *range(17, 22), 25, *range(28, 33), 34, *range(38, 44), *range(50, 90)}
    lines = misses.explain_miss({"donors": "b"}, graph(now), {"donors": "a"}, graph(set()))
    assert lines == [f"donated inputs now {len(now)} (2-7, 9, 17-21, 25, 28-32, 34, ...), was none"]


def test_why_against_a_step_with_no_input_in_common_says_a_new_graph(dev):
    """01's GPT-2 step was diffed against the 4-op step before it: 9 lines about another program."""
    tiny = torch.tensor([-1.0, 2.0, 3.0]).to(dev)
    y = (tiny * 2 + 1).relu().sum()
    xlakit.mark_step()
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).to(dev)
    loss = model(torch.randn(5, 8).to(dev)).sum()
    loss.backward()
    xlakit.mark_step()
    unrelated = xlakit.last_step()
    assert unrelated.why == ("a new graph: the closest cached step (4 nodes, 1 inputs) has none of its input "
                             "shapes at the same position",)
    x = torch.randn(3, 8).to(dev)  # a relative: the same weights, another batch
    loss = model(x).sum()
    loss.backward()
    xlakit.mark_step()
    assert any(line.startswith("input ") for line in xlakit.last_step().why), xlakit.last_step().why
    del y


def test_why_names_the_setting_that_changed(dev, monkeypatch):
    """A step compiled again under check_nans said "flags changed (compiler, platform or settings)"."""
    x = torch.arange(4.0).to(dev)
    y = (x * 3).sin()
    xlakit.mark_step()
    monkeypatch.setattr(xlakit.config, "check_nans", True)
    y = (x * 3).sin()
    xlakit.mark_step()
    why = xlakit.last_step().why
    assert len(why) == 1 and re.fullmatch(r"setting nans now 'on [0-9a-f]+', was 'unset'", why[0]), why
    del y


def test_a_step_without_xla_cost_analysis_gives_xlakits_estimate_in_the_text_too(dev):
    """09's text view said "cost: unknown" beside its HTML's estimate."""
    y = (torch.ones(4, 4).to(dev) @ torch.ones(4, 4).to(dev)).sum()
    xlakit.mark_step()
    record = dataclasses.replace(xlakit.last_step(), cost=None)
    line = panels.cost_line(record)
    assert "no cost analysis" in line and "xlakit's own estimate 1" in line, line
    assert "xlakit's own estimate" in panels.cost_html(record)
    del y


def test_tables_scroll_in_their_own_box_and_text_is_at_least_11px(dev):
    """A Profile tab's table was 1099-1145 px wide in a 928-1102 px tab: cut ("FL" for FLOP/s), the
    tab's only scrollbar under 3333 px of it; its "line" column wrapped a word a line."""
    import re

    from xlakit.notebook import profile_view

    style = render.STYLE
    table_rule = re.search(r"\.xlakit-step table\{([^}]*)\}", style).group(1)
    assert "display:block" in table_rule and "overflow-x:auto" in table_rule and "max-width:100%" in table_rule
    assert re.search(r"\.xlakit-step td\.line\{white-space:nowrap\}", style)
    assert re.search(r"\.xlakit-step h5\{font-size:13px", style)  # a browser's default h5 is 0.83em: 10.8 px
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    x = torch.randn(16, 32).to(dev)
    for i in range(2):
        with xlakit.profile() if i else xlakit.capture() as steps:
            model(x).square().mean().backward()
            xlakit.mark_step()
    page = render.html_view(steps[-1])
    assert page.count('<td class="line"') == min(len(steps[-1].profile.ops), profile_view.TOP_OPS)
    sizes = [int(s) for s in re.findall(r'font-size="(\d+)"', page)]
    sizes += [int(s) for s in re.findall(r"font-size:(\d+)px", page)]
    assert sizes and min(sizes) >= 11
