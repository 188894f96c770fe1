"""%%xla_step regressions, through a real IPython InteractiveShell (as tests/test_notebook.py)."""
import os
import traceback

import pytest
import torch
from IPython.utils.capture import capture_output

import xlakit
from xlakit.core import sources
from xlakit.notebook import profile_view


def run(shell, source):
    with capture_output() as captured:
        result = shell.run_cell(source, store_history=True)
    return captured, result


def test_ipython_syntax_runs_in_an_xla_step_cell(shell, monkeypatch):
    monkeypatch.delenv("XLAKIT_T13", raising=False)
    captured, result = run(shell, "%%xla_step --name ipython-syntax\n"
                                  "%time a = torch.ones(3).to(dev) * 2\n"
                                  "%env XLAKIT_T13=yes\n"
                                  "!echo hi\n"
                                  "a?\n"
                                  "b = (a + 1).sum()")
    result.raise_error()
    assert os.environ["XLAKIT_T13"] == "yes"
    assert shell.user_ns["b"].item() == (torch.ones(3) * 2 + 1).sum().item()
    assert "Wall time" in captured.stdout  # %time ran


def test_lines_after_ipython_syntax_keep_their_cell_line_numbers(shell):
    number = shell.execution_count
    _, result = run(shell, "%%xla_step --name ipython-lines\n"
                           "\n"
                           "%env XLAKIT_T13_LINES=1\n"
                           "c = torch.ones(2).to(dev) * 3\n"
                           "print(c.sum().item())\n"
                           "raise ValueError('here')")
    assert isinstance(result.error_in_exec, ValueError)
    assert traceback.extract_tb(result.error_in_exec.__traceback__)[-1].lineno == 5
    record = xlakit.last_step()
    assert record.source == f"cell {number} line 4"
    assert [sources.describe(n.source) for n in record.graph.nodes] == [f"cell {number} line 3",
                                                                        f"cell {number} line 4"]


def open_widgets() -> int:
    """Widgets open in the kernel: ipywidgets 8.1 keeps them in `_instances`, 7 and 8.0 in `Widget.widgets`."""
    import ipywidgets
    from ipywidgets.widgets import widget

    instances = getattr(widget, "_instances", None)
    return len(instances if instances is not None else ipywidgets.Widget.widgets)


def test_a_cell_run_again_closes_the_widgets_it_showed_before(shell):
    pytest.importorskip("ipywidgets")
    cell = "%%xla_step --name rerun\nr = torch.ones(4).to(dev).cos() * 2"
    counts = []
    for _ in range(50):
        with capture_output():
            shell.run_cell(cell, store_history=True, cell_id="the-same-cell").raise_error()
        counts.append(open_widgets())
    assert counts[-1] == counts[0]


def test_widgets_of_many_cells_stay_bounded(shell):
    pytest.importorskip("ipywidgets")
    from xlakit.notebook import views

    before = open_widgets()
    run(shell, "%%xla_step --name many-0\nm = torch.ones(4).to(dev).sin() * 2")
    per_view = open_widgets() - before
    assert per_view > 0  # the display built its widgets
    counts = []
    for i in range(1, 50):  # distinct cells, as a notebook run from the top
        _, result = run(shell, f"%%xla_step --name many-{i}\nm = torch.ones(4).to(dev).sin() * 2")
        result.raise_error()
        counts.append(open_widgets())
    assert views.OPEN_LIMIT < 50
    assert counts[-1] == counts[-10] <= before + views.OPEN_LIMIT * per_view


def test_a_profiled_step_names_its_lines_by_cell_also_in_a_function_an_earlier_cell_defined(shell):
    defined = shell.execution_count
    run(shell, "def scaled(t):\n    return (t * 3).exp().sum()")[1].raise_error()
    profiled = shell.execution_count
    _, result = run(shell, "%%xla_step --name lines --profile --quiet\ns = scaled(torch.arange(5.0).to(dev))")
    result.raise_error()
    lines = set(xlakit.last_step().profile.by_line)
    assert f"cell {defined} line 2" in lines and lines <= {f"cell {defined} line 2", f"cell {profiled} line 1"}
    tab = profile_view.profile_html(xlakit.last_step())  # the slowest ops' lines too, not IPython's file names
    assert f"<td>cell {defined} line 2</td>" in tab and "ipython-input" not in tab
