"""How long the step view takes for 5000-node graphs (target: each under 1 s). `--quick`: tiny graphs.

Two graphs: a Llama training step of ~5000 nodes (15 layers: grouped by module)
and a 5000-op chain with no modules (grouped by source line, then runs); and
three 20,000-node graphs made without running a step (tests/programs.py's
SHAPES: 5000 sibling modules, 6 levels of modules, none), for the view model,
the static page's drawing and tables, and the widget.
In Python: building the view, its static SVG (Graphviz dot), and a step
view's whole display (HTML and widget). In Chromium (Playwright, Debian's /usr/bin/chromium): the
graph widget's bundle on a page of its own, given the same data a notebook's
widget gets: open it, open a closed group, search, click a node. Each is
timed to the second animation frame after it (the page has painted).
"""
from __future__ import annotations

import http.server
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402

from xlakit.notebook import graph_dot, graph_model, graph_widget, views  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from programs import SHAPES, chain_record, llama_record, module_chain  # noqa: E402  (the graphs tests/test_graph_view.py draws too)

REPEATS = 5
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def display(record) -> dict:
    """What showing a step costs in the kernel: its HTML (static SVG) and its widget, nothing reused."""
    graph_model._LAST.clear()
    graph_dot._LAST.clear()
    view = views.StepView(record)
    widget = view.widget()
    html = view._repr_html_()
    widget.close()
    return {"text/html": html}


def median_ms(fn, repeats: int | None = None) -> float:
    times = []
    for _ in range(repeats or REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


PAGE = """<html><body style="margin:0"><div id="w" style="width:1300px"></div><script type="module">
import widget from "./graph.js";
window.data = await (await fetch("data.json")).json();
window.open_widget = async () => {
  const el = document.getElementById("w");
  el.replaceChildren();
  const t0 = performance.now();
  widget.render({model: {get: (key) => ({graph: window.data})[key], on() {}, off() {}}, el});
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return [performance.now() - t0, Number(el.dataset.boxes)];
};
window.timed = async (action) => {
  const t0 = performance.now();
  action();
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return performance.now() - t0;
};
document.body.dataset.ready = "1";
</script></body></html>"""

# one interaction each, timed in the page: open a closed group and close it again, search (which
# shows the first match), click a node
INTERACTIONS = {
    "open a group": "() => timed(() => { const g = document.querySelector('g.group.closed');"
                    " window.opened = g.dataset.group; g.dispatchEvent(new MouseEvent('click', {bubbles: true})); })",
    "close it": "() => timed(() => document.querySelector(`g.xg-frame[data-group='${window.opened}'] .xg-header`)"
                ".dispatchEvent(new MouseEvent('click', {bubbles: true})))",
    "search (type, Enter)": "() => timed(() => { const s = document.querySelector('.xg-search');"
                            " s.value = window.query; s.dispatchEvent(new Event('input'));"
                            " s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'})); })",
    "click a node": "() => timed(() => document.querySelector('g.xlakit-node.node').dispatchEvent("
                    "new MouseEvent('click', {bubbles: true})))",
}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def browser_timings(data: dict, query: str) -> dict[str, float]:
    """Times in the browser; `query` is what the search looks for."""
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="xlakit-bench-"))
    shutil.copy(graph_widget.BUNDLE, root / "graph.js")
    (root / "data.json").write_text(json.dumps(data))
    (root / "index.html").write_text(PAGE)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    results = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                         "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1320, "height": 760})
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            page.wait_for_selector("body[data-ready='1']")
            page.evaluate("q => window.query = q", query)
            opens, actions = [], {name: [] for name in INTERACTIONS}
            for _ in range(REPEATS):
                ms, boxes = page.evaluate("open_widget()")
                opens.append(ms)
                for name, script in INTERACTIONS.items():
                    try:
                        actions[name].append(page.evaluate(script))
                    except Exception as e:
                        raise RuntimeError(f"{name}: {e}") from None
            results["open (first draw)"] = statistics.median(opens)
            results.update({name: statistics.median(times) for name, times in actions.items()})
            results["boxes shown at first"] = boxes
            browser.close()
    finally:
        server.shutdown()
    return results


def main():
    global REPEATS
    quick = "--quick" in sys.argv  # tiny graphs, once: keeps the harness working (tests/test_bench_smoke.py)
    if quick:
        REPEATS = 1
    layers, ops = (2, 200) if quick else (15, 5000)
    rows = []
    for name, make in ((f"Llama step, {layers} layers (by module)", partial(llama_record, layers)),
                       ("op chain (no modules)", partial(chain_record, ops))):
        record = make()
        view = graph_model.of_record(record)
        data = graph_widget.to_json(view)
        row = {"graph": f"{name}: {record.num_nodes} nodes, {record.num_inputs} inputs",
               "view model": median_ms(lambda: graph_model.build(record.graph, hlo=record.hlo)),
               "static SVG (dot)": median_ms(lambda: graph_dot.to_svg(view, record.graph), min(3, REPEATS)),
               "display (HTML and widget)": median_ms(lambda: display(record), min(3, REPEATS)),
               "widget data KiB": len(json.dumps(data)) / 1024}
        if os.path.exists(CHROMIUM):
            row.update(browser_timings(data, query=record.graph.nodes[-1].op))
        rows.append(row)
    for shape, modules in SHAPES.items():
        graph = module_chain(modules[:len(modules) // 100] if quick else modules)
        view = graph_model.build(graph)
        data = graph_widget.to_json(view)
        row = {"graph": f"{len(graph.nodes)} nodes, modules: {shape}",
               "view model": median_ms(lambda: graph_model.build(graph)),
               "static SVG (dot)": median_ms(lambda: graph_dot.to_svg(view, graph), min(3, REPEATS)),
               "static groups (details)": median_ms(lambda: graph_dot.groups_html(view)),
               "widget data KiB": len(json.dumps(data)) / 1024}
        if os.path.exists(CHROMIUM):
            row.update(browser_timings(data, query="add"))
        rows.append(row)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}; ms, median of {REPEATS} (dot, display: {min(3, REPEATS)})\n")
    for row in rows:
        print(f"### {row['graph']}")
        print("| measure | value |\n|---|---|")
        for c in [c for c in row if c != "graph"]:
            unit = "" if c.endswith(("KiB", "at first")) else " ms"
            print(f"| {c} | {row.get(c, float('nan')):.0f}{unit} |")
        print()


if __name__ == "__main__":
    main()
