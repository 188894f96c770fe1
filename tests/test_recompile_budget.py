"""The recompile budget: config.max_recompiles per user line, %%xla_step --max-compiles per cell;
over it, a warning (config.strict_recompiles: an error) naming each miss's why and compile time."""
import warnings

import pytest
import torch

import xlakit
from xlakit.analysis.budget import RecompileBudgetError, RecompileWarning

pytestmark = pytest.mark.usefixtures("no_disk_cache")  # each test counts compiles


def growing_loop(dev, sizes):
    """One step per size, all marked at the same line; the sums."""
    sums = []
    for n in sizes:
        x = torch.ones(n).to(dev) * 2
        sums.append(x.cumsum(0).sum() - x.cumsum(0)[:-1].sum())  # a program no other test of this run compiles
        xlakit.mark_step()
    return [s.item() for s in sums]


def test_a_loop_over_its_budget_warns_once_naming_each_miss(dev, monkeypatch):
    xlakit.reset()
    monkeypatch.setattr(xlakit.config, "max_recompiles", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sums = growing_loop(dev, [3, 3, 4, 5, 6, 6])
    assert sums == [6.0, 6.0, 8.0, 10.0, 12.0, 12.0]
    over = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(over) == 1, [str(w.message) for w in caught]
    message = str(over[0].message)
    assert "compiled 2 times after its first step, over the budget of 1 (config.max_recompiles = 1)" in message
    assert "input 0 now f32[4], was f32[3]" in message and "input 0 now f32[5], was f32[4]" in message
    assert "compile " in message and " ms)" in message
    assert over[0].filename.endswith("test_recompile_budget.py")  # the user's line, not xlakit's


def test_within_the_budget_nothing_is_said(dev, monkeypatch):
    xlakit.reset()
    monkeypatch.setattr(xlakit.config, "max_recompiles", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompileWarning)
        growing_loop(dev, [7, 7, 8, 9, 9])


def test_strict_raises_after_the_step_computed_its_values(dev, monkeypatch):
    xlakit.reset()
    monkeypatch.setattr(xlakit.config, "max_recompiles", 0)
    monkeypatch.setattr(xlakit.config, "strict_recompiles", True)
    x = None
    with pytest.raises(RecompileBudgetError, match=r"compiled 1 times after its first step.*f32\[11\], was f32\[10\]"):
        for n in (10, 11):
            x = torch.ones(n).to(dev).cumsum(0) * 0 + 3
            xlakit.mark_step()
    assert x.cpu().tolist() == [3.0] * 11


def test_xla_step_max_compiles_counts_the_steps_of_one_run_of_the_cell(shell, monkeypatch):
    from test_notebook import run

    monkeypatch.setattr(xlakit.config, "strict_recompiles", False)
    cell = ("%%xla_step --name budget --quiet --max-compiles 1\n"
            "for n in {sizes}:\n    b = torch.ones(n).to(dev).cumsum(0).mul(1.75).sum()\n    xlakit.mark_step()")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(shell, cell.format(sizes=(20, 20, 21)))
        assert not [w for w in caught if issubclass(w.category, RecompileWarning)]
        _, _, result = run(shell, cell.format(sizes=(24, 25, 26)))
        assert result.success, result.error_in_exec
    over = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(over) == 1 and "cell 'budget' compiled 2 times" in over[0] and "(--max-compiles 1)" in over[0]
    assert "f32[26], was f32[25]" in over[0]
    # the storm fixed: a run within the budget does not warn, whatever the earlier runs compiled
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(shell, cell.format(sizes=(27, 27, 27)))
    assert not [w for w in caught if issubclass(w.category, RecompileWarning)]
