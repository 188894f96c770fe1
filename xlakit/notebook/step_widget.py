"""The step view's widget: one anywidget model holding the record's sections as data (the
header, each tab's HTML, the graph's data). static/graph.js draws the tab bar and the panels,
and the interactive graph in the Graph tab when that tab is first shown."""
from __future__ import annotations

import anywidget
import traitlets

from ..core.record import StepRecord
from . import graph_model, graph_widget, render


class StepWidget(anywidget.AnyWidget):
    _esm = graph_widget.ESM
    header = traitlets.Unicode().tag(sync=True)  # HTML
    sections = traitlets.List().tag(sync=True)   # [title, HTML] per tab; the Graph tab's HTML is None
    graph = traitlets.Dict().tag(sync=True)      # graph_widget.to_json's, for the Graph tab


def of_record(record: StepRecord, name: str | None, previous: StepRecord | None, hlo: bool) -> StepWidget:
    """Tabs (Graph, Key, Why, Donation, Cache and time, Memory, Cost[, Profile][, HLO]) under a one-line
    header. The Graph tab draws the interactive graph, not the static SVG the page without a kernel shows."""
    sections = [[title, None if title == "Graph" else body]
                for title, body in render.sections_html(record, previous, hlo)]
    # the sections' stylesheet goes once, with the header
    return StepWidget(header=render.STYLE + render._header_html(record, name), sections=sections,
                      graph=graph_widget.to_json(graph_model.of_record(record, previous)))
