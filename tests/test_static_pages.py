"""What a page without a kernel shows: nbconvert's HTML (what nbviewer serves) of an
executed notebook and of the stored tutorials holds every step view's graph,
memory and cost tables and every explain() table as plain HTML and inline SVG.

A notebook saved without widget state (JupyterLab's default; how the tutorials
are stored) lets nbconvert pass over the widget view to the static HTML beside it.
"""
import copy
import html.parser
import json
import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

ROOT = pathlib.Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
STEP_VIEW = "\n  key components ("   # a step view's text (a sharding view's also starts "step N")


class _Visible(html.parser.HTMLParser):
    """Counts elements by class, and text, outside <script> (what a page shows with scripts off)."""

    def __init__(self):
        super().__init__()
        self.classes, self.scripts, self._in_script = {}, 0, False

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self._in_script, self.scripts = True, self.scripts + 1
            return
        for name in dict(attrs).get("class", "").split():
            self.classes[name] = self.classes.get(name, 0) + 1

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False


def visible(page: str) -> _Visible:
    parser = _Visible()
    parser.feed(page)
    return parser


def to_html(notebook) -> str:
    return HTMLExporter().from_notebook_node(notebook)[0]


def outputs(notebook, starts: str, having: str = "") -> int:
    """How many outputs' plain text starts with `starts` (and holds `having`)."""
    texts = [o.get("data", {}).get("text/plain", "") for cell in notebook.cells for o in cell.get("outputs", [])]
    return sum(1 for text in texts if text.startswith(starts) and having in text)


CELLS = [
    "%load_ext xlakit\nimport torch, xlakit\ndev = xlakit.device()",
    "%%xla_step --name mlp\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(8, 4).to(dev)\n"
    "model(torch.randn(2, 8).to(dev)).sum().backward()",
    "%%xla_step --name mlp\nmodel(torch.randn(2, 8).to(dev)).sum().backward()",
    "%%xla_step --name mlp --profile\nmodel(torch.randn(2, 8).to(dev)).sum().backward()",
    "report = xlakit.explain(lambda t: torch.nonzero(t.sin() > 0).sum(), torch.arange(4.0))\nreport",
    "%xla_history",
    "%xla_history --plot",
    "xlakit.history()",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """CELLS run by nbclient, which stores the widgets' state (its default, and docs builders')."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with pytest.MonkeyPatch.context() as env:  # an empty cache: the history draws the first step's compile
        env.setenv("XLAKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        NotebookClient(notebook, timeout=600, store_widget_state=True,
                       resources={"metadata": {"path": str(tmp_path_factory.mktemp("run"))}}).execute()
    assert WIDGET_STATE in notebook.metadata["widgets"]
    return notebook


def widget_outputs(notebook) -> int:
    return sum("application/vnd.jupyter.widget-view+json" in o.get("data", {})
               for cell in notebook.cells for o in cell.get("outputs", []))


def shows_every_view(notebook, page: _Visible) -> None:
    steps, reports = outputs(notebook, "step ", STEP_VIEW), outputs(notebook, "explain() ran")
    assert steps == 3 and reports == 1
    for table in ("xlakit-key", "xlakit-timing", "xlakit-memory", "xlakit-buffers", "xlakit-cost"):
        assert page.classes.get(table) == steps, table
    assert page.classes.get("xlakit-breaks") == reports
    # explain()'s break (nonzero) is a row that opens without scripts: the cell's line marked, the graphs drawn
    assert page.classes.get("xlakit-break") == 1 and page.classes.get("xlakit-source") == 1
    assert page.classes.get("at") == 1 and page.classes.get("xlakit-fx-graph") == 2
    assert page.classes.get("xlakit-graph", 0) >= steps + 4          # and each FX graph, as Dynamo and xlakit saw it
    assert page.classes.get("xlakit-history") == 1
    assert page.classes.get("xlakit-profile-ops") == 1                # the profiled step's Profile tab
    assert page.classes.get("xlakit-history-steps") == 2             # %xla_history --plot, xlakit.history()
    assert page.classes.get("compile") >= 2                          # each draws the first step's compile


def test_an_executed_notebook_saved_without_widget_state_shows_every_view_without_a_kernel(executed):
    notebook = copy.deepcopy(executed)
    del notebook.metadata["widgets"]  # as JupyterLab saves a notebook by default: outputs, no widget state
    assert widget_outputs(notebook) == 4  # the live display carries the widgets: the static HTML must win
    page = visible(to_html(notebook))
    shows_every_view(notebook, page)
    assert "jupyter-widgets" not in page.classes                      # no empty widget box


def test_an_executed_notebook_saved_with_widget_state_shows_every_view_without_scripts(executed):
    """nbconvert writes a widget whose state is saved as its placeholder (empty until its scripts
    run) and nothing else of its output: the static HTML beside it shows the view."""
    page = visible(to_html(executed))
    assert page.classes.get("jupyter-widgets") == widget_outputs(executed) == 4
    shows_every_view(executed, page)


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_the_stored_tutorials_show_every_view_without_a_kernel(path):
    notebook = nbformat.read(path, as_version=4)
    stores_state = WIDGET_STATE in notebook.metadata.get("widgets", {})
    assert not stores_state, f"{path.name} stores widget state: static pages would show its widgets (empty " \
                             "without scripts); save it with scripts/run_notebooks.py"
    page = visible(to_html(notebook))
    steps = outputs(notebook, "step ", STEP_VIEW)
    assert page.classes.get("xlakit-graph", 0) >= steps
    assert page.classes.get("xlakit-key", 0) == steps
    # XLA's memory analysis, where the executor gives one (torch_xla's does not)
    assert page.classes.get("xlakit-memory", 0) == outputs(notebook, "step ", "\n  memory: peak ")
    assert page.classes.get("xlakit-breaks", 0) == outputs(notebook, "explain() ran")
    assert "jupyter-widgets" not in page.classes


def test_the_stored_tutorials_keep_no_machine_paths():
    for path in TUTORIALS:
        text = json.dumps(json.loads(path.read_text())["cells"])
        for leak in ("/tmp/ipykernel_", "site-packages", os.path.expanduser("~") + "/"):
            assert leak not in text, f"{path.name} shows {leak!r}"
