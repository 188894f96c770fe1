"""%%xla_step regressions, through a real IPython InteractiveShell (as tests/test_notebook.py)."""
import os
import traceback

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import xlakit
from xlakit import sources


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext xlakit", store_history=True)
    ip.run_cell("import torch, xlakit\ndev = xlakit.device()", store_history=True)
    return ip


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
