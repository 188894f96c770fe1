"""The interactive graph: an anywidget widget (JupyterLab, Notebook 7, VS Code,
Colab) that draws a GraphView sent as plain data; the JavaScript, built from
js/src with its layout library (dagre) inside, is xlakit/notebook/static/graph.js,
which draws the step view's widget (step_widget.py) too."""
from __future__ import annotations

import pathlib

import anywidget
import traitlets

from .graph_model import GraphView

BUNDLE = pathlib.Path(__file__).parent / "static" / "graph.js"
# The bundle's text, not its path: anywidget watches an `_esm` path for edits, and the watcher's
# signal holds every instance made from it, so a closed view was never freed
ESM = BUNDLE.read_text()


class GraphWidget(anywidget.AnyWidget):
    _esm = ESM
    graph = traitlets.Dict().tag(sync=True)  # to_json's


def to_json(view: GraphView) -> dict:
    """The view as the widget reads it (fields that are empty or false left out)."""
    def compact(fields: dict) -> dict:
        return {k: v for k, v in fields.items() if v not in ("", [], False) or k == "group"}

    return {
        "items": [compact({"kind": i.kind, "title": i.title, "avals": list(i.avals), "group": i.group,
                           "preds": i.preds, "op": i.op, "module": i.module, "user": i.user,
                           "library": i.library, "args": i.args, "hlo": list(i.hlo), "donated": i.donated,
                           "output": i.output, "split": i.split, "changed": i.changed}) for i in view.items],
        "groups": [{"name": g.name, "label": g.label, "parent": g.parent, "groups": g.groups, "items": g.items}
                   for g in view.groups],
        "expanded": sorted(view.expanded),
        "opened": view.opened,  # the first view closes the last ones where the canvas is too small
    }
