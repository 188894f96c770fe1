"""The history as a picture (%xla_history --plot, xlakit.history()): per step its Python,
compile and execute time, a mark on each step that compiled with its why, the peak memory."""
import re

import torch

import xlakit
from xlakit.notebook import history_plot


def test_the_plot_draws_each_steps_time_its_compiles_and_peak_memory(dev, no_disk_cache):
    xlakit.reset()
    sums = []
    for n in (30, 30, 31, 31):
        sums.append((torch.ones(n).to(dev).cumsum(0) * 1.5).sum())
        xlakit.mark_step()
    assert [s.item() for s in sums] == [697.5, 697.5, 744.0, 744.0]
    records = xlakit.steps()
    plot = xlakit.history()
    page = plot._repr_html_()
    assert "<script" not in page and page.count('<svg class="xlakit-history-steps"') == 1
    # three parts of each step's wall time, each with its milliseconds
    for r in records:
        for part in ("Python (trace + lower)", "compile", "execute"):
            assert re.search(rf"step {r.index} \([^)]*\): {re.escape(part)} [\d.]+ ms", page), (r.index, part)
    # a dot per compile, the second naming what changed
    dots = re.findall(r'<circle class="compile".*?<title>(.*?)</title>', page)
    assert len(dots) == 2 and "input 0 now f32[31], was f32[30]" in dots[1]
    assert 'points="' in page and "peak memory per device" in page
    assert repr(plot).startswith("4 steps: Python ") and "2 compiled" in repr(plot)


def test_no_steps_is_said(dev):
    xlakit.reset()
    assert history_plot.text([]) == "No steps yet."
    assert "No steps yet." in history_plot.HistoryPlot([])._repr_html_()


def test_a_step_loaded_from_the_disk_cache_has_its_mark_and_the_text_is_readable(dev):
    """On a second run, steps loaded from the disk cache showed "compile" bars and no mark under
    them, though the legend promised one under each compile; 9 px text, 10 px bars."""
    import dataclasses

    from xlakit.core.record import Cache

    xlakit.reset()
    y = torch.ones(40).to(dev).cumsum(0) * 2.5
    xlakit.mark_step()
    loaded = dataclasses.replace(xlakit.steps()[-1], cache=Cache.PERSISTENT_HIT)
    page = history_plot.HistoryPlot([("cell 1", loaded)])._repr_html_()
    rings = re.findall(r'<circle class="loaded".*?<title>(.*?)</title>', page)
    assert rings == [f"step {loaded.index} loaded its executable from the disk cache (not compiled)"]
    assert "loaded from the disk cache (ring)" in page
    assert min(int(s) for s in re.findall(r'font-size="(\d+)"', page)) >= 11
    bars = re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)" height="[\d.]+" fill="#\w+"><title>step', page)
    assert len(bars) == 3 and min(float(w) for w in bars) >= 12
    del y
