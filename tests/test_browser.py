"""The step widget in a real browser: JupyterLab 4 and Notebook 7 on loopback,
Chromium driven by Playwright.

JupyterLab runs notebooks/01_quickstart.ipynb and shows its step views (graph,
key table, donation table naming a parameter): docs/quickstart.png, which the
README shows. Both frontends run a small Llama's training steps and use the
interactive graph: open a closed module group and close it again, search, and
click a node for its details (a screenshot of each); then the step view's tabs, each
screenshotted and checked for content sticking out of its box (docs/img/). The screenshots go to
docs/ only under `make screenshots` (XLAKIT_SCREENSHOTS=docs): a test run
leaves the tree as it found it.
"""
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

if not os.path.exists(CHROMIUM):
    print(f"test_browser: skipped, Chromium is not installed at {CHROMIUM} (Debian package 'chromium')")
    pytest.skip("Chromium is not installed (Debian package 'chromium')", allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api")
sync_playwright, PlaywrightTimeout = playwright_api.sync_playwright, playwright_api.TimeoutError

LLAMA_CELLS = [
    "%load_ext xlakit\nimport torch, transformers, xlakit\ntransformers.logging.set_verbosity_error()\n"
    "dev = xlakit.device()\n"
    "cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
    "                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)\n"
    "torch.manual_seed(0)\nmodel = transformers.LlamaForCausalLM(cfg).to(dev)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\nids = torch.randint(0, 64, (2, 8)).to(dev)",
    *[f"%%xla_step --name train{flags}\nopt.zero_grad()\nmodel(input_ids=ids, labels=ids).loss.backward()\nopt.step()"
      for flags in ("", " --profile --nans")],  # the second view has every tab
    "print('all cells ran')",
]

EXPLAIN_CELLS = [
    "import torch, xlakit\ntorch.manual_seed(0)\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))\n"
    "    def forward(self, x):\n        h = self.encoder(x)\n        print('encoded')\n        return h.sin().sum()",
    "xlakit.explain(Net(), torch.randn(3, 4))",
    "print('all cells ran')",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(cells: list[str]) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                       "source": source} for i, source in enumerate(cells)],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory):
    root = tmp_path_factory.mktemp("notebooks")
    shutil.copy(ROOT / "notebooks" / "01_quickstart.ipynb", root)
    (root / "llama.ipynb").write_text(json.dumps(_notebook(LLAMA_CELLS)))
    (root / "explain.ipynb").write_text(json.dumps(_notebook(EXPLAIN_CELLS)))
    return root


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the screenshots go: XLAKIT_SCREENSHOTS (relative to the checkout), else a temporary folder."""
    where = os.environ.get("XLAKIT_SCREENSHOTS")
    return ROOT / where if where else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module", params=["lab", "notebook"])
def server(request, notebooks):
    """(frontend, base url, token): JupyterLab 4 or Notebook 7 serving `notebooks`."""
    frontend = request.param
    token, port = secrets.token_hex(12), _free_port()
    log = open(notebooks / f"{frontend}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", frontend, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"Jupyter {frontend} did not start: {(notebooks / f'{frontend}.log').read_text()[-2000:]}")
    yield frontend, url, token
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def page():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        yield page
        browser.close()
        assert not [e for e in errors if "xlakit" in e or "graph" in e], errors


def kernel_idle(server, name: str) -> None:
    """Waits until the server says notebook `name`'s kernel has started and is idle: clicked before
    that, the Run menu did nothing, and each try waited out its timeout (in full runs, 30 s lost)."""
    _, url, token = server
    deadline = time.time() + 120
    while time.time() < deadline:
        with urllib.request.urlopen(f"{url}/api/sessions?token={token}", timeout=10) as answer:
            sessions = json.load(answer)
        if any(s["path"].endswith(name) and s["kernel"]["execution_state"] == "idle" for s in sessions):
            return
        time.sleep(0.2)
    pytest.fail(f"the kernel of {name} was not idle after 120 s: {sessions}")


def run_all(page, server, name: str) -> None:
    """Open notebook `name` and run all its cells from the Run menu."""
    frontend, url, token = server
    # JupyterLab restores the tabs a previous test left open, unless told to reset its workspace
    where = f"lab/tree/{name}?reset&" if frontend == "lab" else f"notebooks/{name}?"
    page.goto(f"{url}/{where}token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    # the frontend may open a dialog while the kernel starts (it intercepts clicks): let it close, or accept it
    try:
        page.wait_for_selector(".jp-Dialog", state="detached", timeout=15_000)
    except PlaywrightTimeout:
        page.locator(".jp-Dialog .jp-mod-accept").first.click()
    page.wait_for_function("document.querySelector('.jp-Notebook .jp-Cell') !== null")
    kernel_idle(server, name)
    for attempt in range(10):  # the menu item is inert until the notebook has focus and a kernel
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:  # a cell that runs or waits shows [*]
            page.wait_for_function("[...document.querySelectorAll('.jp-InputPrompt')]"
                                   ".some(p => p.textContent.includes('*'))", timeout=5_000)
            break
        except PlaywrightTimeout:
            if attempt == 9:
                raise
    page.wait_for_function("[...document.querySelectorAll('.jp-InputPrompt')]"
                           ".every(p => !p.textContent.includes('*'))", timeout=300_000)
    news = page.locator(".jp-toast-button", has_text="No")  # JupyterLab's news prompt
    if news.count():
        news.first.click()


def widgets_drawn(page, count: int):
    """The graph widgets, once `count` have drawn (a widget's view renders after its cell finished)."""
    page.wait_for_function(f"document.querySelectorAll('.xlakit-graph-widget[data-boxes]').length >= {count}",
                           timeout=60_000)
    widgets = page.locator(".xlakit-graph-widget")
    assert widgets.count() == count
    return widgets


def shown_once(page, count: int) -> None:
    """Each view's static HTML, the output after its widget's, is hidden (its Out[n] too) once the widget is drawn."""
    shown = page.evaluate("() => [...document.querySelectorAll(\"[class^='xlakit-widget-'][class$='-html']\")]"
                          ".map(box => box.closest('.jp-OutputArea-child').checkVisibility())")
    assert shown == [False] * count


def no_errors_shown(page) -> None:
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not any("Error" in errors.nth(i).inner_text() for i in range(errors.count()))


def test_quickstart_renders_the_step_widget(server, notebooks, page, shots):
    """Over 20 s: JupyterLab in Chromium runs the whole quickstart (its GPT-2 fine-tune among it)."""
    if server[0] != "lab":
        pytest.skip("the README's screenshot is JupyterLab's")
    run_all(page, server, "01_quickstart.ipynb")
    # three %%xla_step cells (a tiny step twice, then GPT-2's training step), each drawing its graph widget
    widgets_drawn(page, 3)
    shown_once(page, 3)
    assert page.locator(".xlakit-graph-widget g.xlakit-node").count() > 10
    page.locator(".xlakit-step-view [role=tab]", has_text="Key").last.click()
    key = page.locator(".xlakit-step-view table.xlakit-key").last
    key.wait_for(state="visible", timeout=10_000)
    key_text = key.inner_text()
    for component in ("graph", "inputs", "donors", "backend", "flags", "metadata"):
        assert component in key_text
    page.locator(".xlakit-step-view [role=tab]", has_text="Donation").last.click()
    donation = page.locator(".xlakit-step-view table.xlakit-donation").last
    donation.wait_for(state="visible", timeout=10_000)
    # its rows can come a moment after the table under load (seen once in a full run): wait for them
    page.wait_for_function("[...document.querySelectorAll('.xlakit-step-view table.xlakit-donation')].pop()"
                           "?.innerText.includes('transformer.wte.weight')", timeout=10_000)
    assert "transformer.wte.weight" in donation.inner_text()
    no_errors_shown(page)
    page.locator(".xlakit-step-view [role=tab]", has_text="Graph").last.click()
    page.locator(".xlakit-graph-widget").last.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "quickstart.png"))


# A box fully inside the graph's canvas (boxes outside it are panned away), marked to be clicked;
# of those, the first whose text has `text`, if any does.
_PICK = """(widget, [selector, text]) => {
  document.querySelectorAll('[data-pick]').forEach(n => n.removeAttribute('data-pick'));
  const c = widget.querySelector('.xg-canvas').getBoundingClientRect();
  const shown = [...widget.querySelectorAll(selector)].filter(n => { const r = n.getBoundingClientRect();
    return r.top > c.top && r.bottom < c.bottom && r.left > c.left && r.right < c.right; });
  const box = shown.find(n => n.textContent.includes(text)) || shown[0];
  if (box) box.setAttribute('data-pick', '1');
  return box ? (box.dataset.group ?? box.dataset.item) : null;
}"""


def pick(widget, selector: str, text: str = ""):
    found = widget.evaluate(_PICK, [selector, text])
    assert found is not None, f"no {selector} in view"
    return widget.locator("[data-pick='1']"), found


def test_the_graph_widget_opens_closes_searches_and_shows_details(server, notebooks, page, shots):
    """Over 20 s: two Llama training steps (the second profiled) run in the browser's kernel, the
    graph widget driven by clicks, each tab of the step view clicked and screenshotted."""
    frontend, _, _ = server
    run_all(page, server, "llama.ipynb")
    no_errors_shown(page)
    assert "all cells ran" in page.locator(".jp-OutputArea-output").last.inner_text()
    widget = widgets_drawn(page, 2).last  # the second step: the optimizer state is new, so some nodes are marked changed
    shown_once(page, 2)
    output = widget.locator("xpath=ancestor::div[contains(@class, 'jp-OutputArea-output')]")
    widget.scroll_into_view_if_needed()
    fits_its_canvas(widget)
    # Notebook 7's sticky toolbar does not cover the search box, and the view is not in a scrolled output box
    assert widget.evaluate("w => { const r = w.querySelector('.xg-search').getBoundingClientRect();"
                           "return document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2)"
                           " === w.querySelector('.xg-search'); }")
    assert output.evaluate("o => { const a = o.closest('.jp-OutputArea'); return a.scrollHeight <= a.clientHeight + 1; }")
    assert widget.locator("g.xlakit-node.changed").count() > 0
    assert widget.locator("g.xlakit-node.group.closed").count() > 0  # 700+ nodes open grouped
    output.screenshot(path=str(shots / f"graph_{frontend}_open.png"))

    # open a closed module group: its boxes appear inside its frame; close it from its title
    before = int(widget.get_attribute("data-boxes"))
    group, index = pick(widget, "g.xlakit-node.group.closed", "self_attn")
    group.click()
    frame = widget.locator(f"g.xg-frame[data-group='{index}']")
    frame.wait_for(timeout=5_000)
    assert int(widget.get_attribute("data-boxes")) > before
    output.screenshot(path=str(shots / f"graph_{frontend}_group.png"))
    header = frame.locator(".xg-header").first
    size = header.bounding_box()
    header.click(position={"x": min(24, size["width"] / 2), "y": size["height"] / 2})  # its title, at the left
    widget.locator(f"g.closed[data-group='{index}']").wait_for(timeout=5_000)
    assert int(widget.get_attribute("data-boxes")) == before
    fits_its_canvas(widget)  # re-centred: as at first

    # search: every softmax, forward and backward, of both layers; the first one shown and selected
    widget.locator(".xg-search").fill("softmax")
    widget.locator(".xg-search").press("Enter")
    first, _, found = widget.locator(".xg-found").inner_text().partition(" of ")
    assert first == "1" and int(found) >= 4
    selected = widget.locator("g.xlakit-node.selected")
    assert selected.count() == 1 and "softmax" in selected.text_content()
    assert "softmax" in widget.locator(".xg-details").inner_text()
    output.screenshot(path=str(shots / f"graph_{frontend}_search.png"))

    # click a node: its op, shapes, module, lines and the HLO instructions it became
    node, _ = pick(widget, "g.xlakit-node.node:not(.selected)", "bmm")
    title = node.locator("text").first.text_content().rstrip("…")
    node.click()
    assert widget.locator(".xg-title").inner_text().startswith(title)
    details = widget.locator(".xg-details").inner_text()
    for row in ("op", "shapes", "module", "user line", "HLO"):
        assert row in details, details
    assert widget.locator("g.xlakit-node.selected").count() == 1
    output.screenshot(path=str(shots / f"graph_{frontend}_details.png"))
    view = widget.locator("xpath=ancestor::*[contains(@class, 'xlakit-step-view')]")
    tabs_switch(view)
    every_tab_fits(view, shots / "img", frontend)


# The boxes of the graph outside the part of its canvas the details panel leaves, and how many there are
_OUTSIDE = """widget => {
  const c = widget.querySelector('.xg-canvas').getBoundingClientRect();
  const right = Math.min(c.right, widget.querySelector('.xg-details').getBoundingClientRect().left);
  const boxes = [...widget.querySelectorAll('g.xg-box, g.xg-frame')];
  const outside = boxes.filter(n => { const r = n.getBoundingClientRect();
    return r.left < c.left - 0.5 || r.top < c.top - 0.5 || r.right > right + 0.5 || r.bottom > c.bottom + 0.5; });
  return [outside.map(n => n.textContent.slice(0, 40)), boxes.length];
}"""


def fits_its_canvas(widget) -> None:
    """The graph at its full size (11 px text) and all of it in sight, beside the details panel."""
    outside, boxes = widget.evaluate(_OUTSIDE)
    assert boxes > 10 and outside == [], outside
    assert float(widget.get_attribute("data-scale")) >= 1


# The shown tab's elements that stick out of its panel (or of the output box) at the right, unless
# a box of theirs that scrolls (or clips) fits
_STICKING_OUT = """view => {
  const panel = view.querySelector('[role=tabpanel]:not([hidden])');
  const right = Math.min(panel.getBoundingClientRect().right,
                         view.closest('.jp-OutputArea-output').getBoundingClientRect().right) + 1;
  const scrolls = n => ['auto', 'scroll', 'hidden'].includes(getComputedStyle(n).overflowX);
  return [...panel.querySelectorAll('*')].filter(n => {
    const r = n.getBoundingClientRect();
    if (!r.width || r.right <= right) return false;
    for (let a = n.parentElement; a && a !== panel; a = a.parentElement) {
      if (scrolls(a) && a.getBoundingClientRect().right <= right) return false;
    }
    return true;
  }).map(n => `${n.tagName}.${n.className.baseVal ?? n.className}: ${Math.round(n.getBoundingClientRect().right - right)} px`)
    .slice(0, 5);
}"""


def every_tab_fits(view, shots: Path, frontend: str) -> None:
    """Each tab of the step view, clicked and screenshotted: nothing in it sticks out at the right."""
    shots.mkdir(exist_ok=True)
    tabs = view.locator("[role=tablist] > [role=tab]")
    titles = tabs.all_inner_texts()
    assert {"Profile", "Numerics"} <= set(titles)
    sticking_out = {}
    for i, title in enumerate(titles):
        tabs.nth(i).click()
        view.locator("[role=tabpanel]:not([hidden])").wait_for()
        # the view's top as it opens in the window: a 3000 px tab is not a picture for the docs
        view.evaluate("v => v.scrollIntoView({block: 'start'})")
        box = view.bounding_box()
        view.page.screenshot(path=str(shots / f"{frontend}_{title.lower().replace(' ', '_')}.png"),
                             clip={**box, "height": min(box["height"], 760)})
        sticking_out[title] = view.evaluate(_STICKING_OUT)
    assert sticking_out == dict.fromkeys(sticking_out, []), sticking_out


def tabs_switch(view) -> None:
    """The step view's tabs, in the sections' order, one selected: the arrow keys, Home and a
    click select another and show its panel alone; the graph is kept, not drawn again."""
    tabs, panels = view.locator("[role=tablist] > [role=tab]"), view.locator("[role=tabpanel]")
    assert tabs.all_inner_texts()[:7] == ["Graph", "Key", "Why", "Donation", "Cache and time", "Memory", "Cost"]
    assert panels.count() == tabs.count()

    def selected() -> str:
        assert view.locator("[role=tab][aria-selected=true]").count() == 1
        shown = view.locator("[role=tabpanel]:not([hidden])")
        assert shown.count() == 1
        assert shown.get_attribute("aria-labelledby") == view.locator("[aria-selected=true]").get_attribute("id")
        return view.locator("[role=tab][aria-selected=true]").inner_text()

    assert selected() == "Graph"
    tabs.first.focus()
    tabs.first.press("ArrowRight")
    assert selected() == "Key" and view.locator("table.xlakit-key").is_visible()
    assert not view.locator(".xlakit-graph-widget").is_visible()
    view.locator("[role=tab]", has_text="Donation").click()
    assert selected() == "Donation" and view.locator("[role=tabpanel]:not([hidden]) h4").inner_text() == "Donation"
    view.locator("[role=tab][aria-selected=true]").press("Home")
    assert selected() == "Graph" and view.locator(".xlakit-graph-widget g.xlakit-node.selected").count() == 1


def test_a_break_row_of_explain_opens_on_its_source_and_the_graphs_beside_it(server, notebooks, page, shots):
    frontend, _, _ = server
    run_all(page, server, "explain.ipynb")
    no_errors_shown(page)
    assert "all cells ran" in page.locator(".jp-OutputArea-output").last.inner_text()
    page.locator(".jupyter-widget-Collapse").first.wait_for(timeout=30_000)
    shown_once(page, 1)
    row = page.locator(".jupyter-widget-Collapse", has_text="break 1 at cell 1 line 9").first
    row.locator(".jupyter-widget-Collapse-header").first.click()
    opened = page.locator(".jupyter-widget-Collapse-open")
    opened.first.wait_for(timeout=10_000)
    # Dynamo's explanation, and the cell's source with the break's line marked
    assert "Failed to trace builtin operator" in opened.first.inner_text()
    assert "print('encoded')" in opened.locator("pre.xlakit-source .at").first.inner_text()
    # the graph before the break, drawn by the step view's widget: the encoder's ops in its module groups
    widget = opened.locator(".xlakit-graph-widget[data-boxes]").first
    widget.wait_for(state="visible", timeout=30_000)
    nodes = widget.locator("g.xlakit-node.node")
    assert nodes.count() == 3 and "linear" in nodes.first.text_content()  # linear, relu, linear
    assert widget.locator("g.xg-frame").count() == 4  # encoder, encoder.0, encoder.1, encoder.2
    # its canvas as tall as the graph, not the 620 px a large one gets
    assert widget.locator(".xg-canvas").bounding_box()["height"] < 560
    node, _ = pick(widget, "g.xlakit-node.node", "relu")
    node.click()
    details = widget.locator(".xg-details").inner_text()
    assert "module" in details and "cell 1 line 8" in details and "HLO" not in details
    opened.first.scroll_into_view_if_needed()
    opened.first.screenshot(path=str(shots / f"explain_{frontend}.png"))
