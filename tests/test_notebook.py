"""%%xla_step and the views, driven through a real IPython InteractiveShell."""
import re

import torch
from IPython.utils.capture import capture_output

import xlakit
from xlakit.notebook import graph_svg, render

from programs import chain_record


def run(shell, source):
    """Run one cell; return (plain texts, htmls) of what it displayed, and the result. A view's
    widget is an output of its own, before its text and HTML: left out."""
    with capture_output() as captured:
        result = shell.run_cell(source, store_history=True)
    shown = [o.data for o in captured.outputs if "application/vnd.jupyter.widget-view+json" not in o.data]
    texts = [data.get("text/plain", "") for data in shown]
    htmls = [data.get("text/html", "") for data in shown]
    return texts, htmls, result


def test_shape_change_is_a_miss_that_names_the_input(shell, no_disk_cache):
    run(shell, "%%xla_step --name shapes\nx = torch.ones(3).to(dev)\ny = (x * 2).sum()")
    texts, htmls, _ = run(shell, "%%xla_step --name shapes\nx = torch.ones(4).to(dev)\ny = (x * 2).sum()")
    assert len(texts) == 1
    assert "cache miss" in texts[0]
    assert "input 0 now f32[4], was f32[3]" in texts[0]
    assert re.search(r"inputs\s+\w+\s+\*changed\*", texts[0])
    assert "<svg" in htmls[0] and "xlakit-key" in htmls[0]


def test_metadata_only_change_is_a_hit_with_changed_metadata(shell):
    run(shell, "%%xla_step --name meta\nz = torch.arange(6.0).to(dev)\nw = z.sin() * 3")
    texts, _, _ = run(shell, "%%xla_step --name meta\nz = torch.arange(6.0).to(dev)\n\n# moved down\nw = z.sin() * 3")
    assert "cache hit" in texts[0]
    assert re.search(r"metadata \w+ \(not in key\)\s+\*changed\*", texts[0])
    assert re.search(r"hit rate so far</td><td>\d+%", run(shell, "%%xla_step\nw2 = z.sin() * 3")[1][0])
    assert "*changed*" not in texts[0].split("metadata")[0]


def test_training_step_shows_donated_parameters_by_module_name(shell):
    run(shell, "torch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),"
               " torch.nn.Linear(8, 1)).to(dev)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
               "data = torch.randn(5, 4).to(dev)")
    cell = "%%xla_step --name train\nopt.zero_grad()\nmodel(data).square().mean().backward()\nopt.step()"
    run(shell, cell)
    texts, htmls, _ = run(shell, cell)
    assert "0.weight" in texts[-1] and "2.bias" in texts[-1]
    assert 'class="xlakit-donation"' in htmls[-1] and "0.weight" in htmls[-1]


def test_cell_error_still_shows_records_and_reraises(shell):
    texts, _, result = run(shell, "%%xla_step --name boom\na = torch.ones(2).to(dev) * 5\n"
                                  "print(a.sum().item())\nraise ValueError('boom')")
    assert isinstance(result.error_in_exec, ValueError)
    assert any("trigger=item" in t for t in texts)


def test_history_lists_every_step_and_clears(shell):
    run(shell, "%%xla_step --name hist --quiet\nq = torch.ones(2).to(dev) + 1")
    texts, htmls, _ = run(shell, "%xla_history")
    assert "hist" in texts[-1] and "xlakit-history-plot" in htmls[-1]
    run(shell, "%xla_history --clear")
    texts, _, _ = run(shell, "%xla_history")
    assert "hist" not in texts[-1]


def test_history_keeps_the_record_limit_set_after_import(shell, monkeypatch):
    """Its length was fixed at import: a config.record_limit of 50 set later kept 120."""
    from xlakit.notebook import magics

    run(shell, "%xla_history --clear")
    monkeypatch.setattr(xlakit.config, "record_limit", 3)
    for i in range(5):
        run(shell, f"%%xla_step --name limit --quiet\nq = torch.ones(2).to(dev) + {i}")
    assert [name for name, _ in magics.HISTORY] == ["limit"] * 3
    assert [r.index for _, r in magics.HISTORY] == [r.index for r in xlakit.steps()[-3:]]


def test_history_says_unknown_donated_for_a_torch_xla_cache_hit(dev):
    """torch_xla says what it donates only when it compiles: the step view said unknown, the history 0 B."""
    import dataclasses

    from xlakit.core.record import Backend, Cache

    y = torch.ones(3).to(dev) * 2
    xlakit.mark_step()
    hit = dataclasses.replace(xlakit.steps()[-1], backend=Backend.TORCH_XLA, cache=Cache.HIT, donated=())
    assert render.donation_lines(hit)[0].startswith("unknown")
    assert render.history_text([("cell 1", hit)]).splitlines()[1].split()[6] == "unknown"
    assert "<td>unknown</td>" in render.history_html([("cell 1", hit)])
    assert "0 B" in render.history_text([("cell 1", dataclasses.replace(hit, backend=Backend.XLAKIT))])
    del y


def test_graph_renders_without_graphviz(monkeypatch, dev):
    monkeypatch.setenv("PATH", "")
    x = torch.ones(3).to(dev)
    y = (x.exp() + 1).sum()
    xlakit.mark_step()
    svg = graph_svg.to_svg(xlakit.last_step().graph)
    assert svg.startswith("<svg") and svg.count('class="xlakit-node') == 3 + 1  # exp, add, sum + 1 input
    del y


def test_a_5000_node_graph_is_grouped(dev):
    graph = chain_record(5000).graph
    assert len(graph.nodes) == 5000
    svg = graph_svg.to_svg(graph)
    assert 'data-grouped="true"' in svg
    assert svg.count('class="xlakit-node') <= graph_svg.MAX_BOXES
