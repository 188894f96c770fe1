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


def open_widgets() -> dict:
    """The widgets open in the kernel, by model id: ipywidgets 8.1 keeps them in `_instances`, 7 and 8.0 in
    `Widget.widgets`."""
    import ipywidgets
    from ipywidgets.widgets import widget

    instances = getattr(widget, "_instances", None)
    return dict(instances if instances is not None else ipywidgets.Widget.widgets)


def test_a_step_view_is_one_widget_model(shell):
    """One model (and the Layout every DOMWidget has) holds a step view's state in the kernel, not one per tab."""
    pytest.importorskip("anywidget")
    from xlakit.notebook.step_widget import StepWidget

    before = open_widgets()
    run(shell, "%%xla_step --name one-model\nm = torch.ones(4).to(dev).sin() * 2")[1].raise_error()
    new = [w for key, w in open_widgets().items() if key not in before]
    shown = [w for w in new if isinstance(w, StepWidget)]
    assert len(shown) == 1 and {w.model_id for w in new} == {shown[0].model_id, shown[0].layout.model_id}


@pytest.mark.parametrize("which", ["step", "graph"])
def test_a_closed_view_is_freed(which):
    """anywidget's watcher of an `_esm` file path held every instance: 90 closed views stayed alive."""
    pytest.importorskip("anywidget")
    import gc
    import weakref

    from xlakit.notebook.graph_widget import GraphWidget
    from xlakit.notebook.step_widget import StepWidget

    widget = StepWidget(header="", sections=[], graph={}) if which == "step" else GraphWidget(graph={})
    alive = weakref.ref(widget)
    widget.close()
    del widget
    gc.collect()
    assert alive() is None


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
