"""BreakReport -> text, static HTML and a widget: the views of xlakit.explain's report.

Each of Dynamo's breaks is a row that opens: Dynamo's explanation and hints,
the source around the break's line (the line marked), and the FX graphs on
either side of it, each drawn twice: as Dynamo captured it (torch ops grouped
by module path) and as xlakit compiled it (aten ops grouped by the executable
each went to, HLO splits marked). Then every FX graph the same way. Graphs are
drawn by the step view's code: the dagre widget (graph_widget.py) where a
kernel runs, Graphviz dot's SVG (graph_dot.py) in static pages; static pages
open the rows with <details>, no script needed.
"""
from __future__ import annotations

import dataclasses
import html

from ..core import sources
from ..core.record import GraphInfo
from ..integrations import breaks
from ..integrations.breaks import BreakReport, FxGraph, GraphBreak
from ..integrations.fx_interpreter import CompiledGraph
from . import graph_dot, graph_model
from .render import STYLE
from .views import Displayed

BREAK_STYLE = """<style>
.xlakit-step details{margin:4px 0}.xlakit-step summary{cursor:pointer;font-family:monospace;font-size:12px}
.xlakit-step pre.xlakit-source{font-size:12px;background:#f8f9fa;border:1px solid #eee;padding:4px;margin:4px 0}
.xlakit-step pre.xlakit-source .at{background:#fce8e6;font-weight:bold}
.xlakit-step .xlakit-dynamo{font:12px monospace;margin:4px 0}
.xlakit-step .xlakit-sides{display:flex;gap:8px;align-items:flex-start}.xlakit-step .xlakit-sides>div{flex:1;min-width:0}.xlakit-step .xlakit-dynamo ul{margin:2px 0}
</style>"""
DYNAMO_TITLE, COMPILED_TITLE = "as Dynamo captured it (torch ops, by module)", "as xlakit compiled it (aten ops, by executable)"


class BreakView(BreakReport, Displayed):
    """A BreakReport (the same data: `path()`, `paths`, `fx_graphs`, `breaks`)
    that also shows itself: text, HTML with rows that open, and a widget."""

    @classmethod
    def of(cls, report: BreakReport) -> BreakView:
        return cls(**{f.name: getattr(report, f.name) for f in dataclasses.fields(BreakReport)})

    # -- static HTML ------------------------------------------------------------------
    def _repr_html_(self) -> str:
        svgs: dict[tuple[int, str], str] = {}  # (FX graph, drawing): its SVG, drawn once for the page

        def graph_html(g: FxGraph, side: str = "") -> str:
            name = f"FX graph {g.index}" + (f" ({side} the break)" if side else "")
            parts = [f"<h4>{name}: {DYNAMO_TITLE}</h4>", _svg(svgs, g, None)]
            for which, c in _compiled(g):
                parts += [f"<h4>{name}{which}: {COMPILED_TITLE}</h4>", splits_html(c), _svg(svgs, g, which)]
            return f"<div>{''.join(parts)}</div>"

        rows = "".join(
            f"<details class='xlakit-break'><summary>{html.escape(_row_title(b))}</summary>{reason_html(b)}"
            f"{source_html(b)}<div class='xlakit-sides'>{''.join(graph_html(self.fx_graphs[i], side) for i, side in _sides(b))}"
            "</div></details>"
            for b in self.breaks)
        graphs = "".join(f"<details class='xlakit-fx-graph'><summary>{html.escape(_graph_title(g))}</summary>"
                         f"{graph_html(g)}</details>" for g in self.fx_graphs)
        return (f"{STYLE}{BREAK_STYLE}<div class='xlakit-step'>{self._table_html()}"
                f"{'<h4>Graph breaks</h4>' + rows if rows else ''}<h4>FX graphs</h4>{graphs}</div>")

    def _table_html(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(p.path)}</td><td>{p.graphs}</td><td>{p.breaks}</td>"
                       f"<td>{'<br>'.join(html.escape(w) for w in p.why)}</td></tr>" for p in self.paths)
        return (f"<div>{html.escape(self.note)}</div><table class='xlakit-breaks'><tr><th>path</th>"
                f"<th>graphs</th><th>breaks</th><th>where and why</th></tr>{rows}</table>")

    # -- widget -----------------------------------------------------------------------
    def widget(self):
        """The table; a row per break that opens (its reason, source, and the FX
        graphs on either side, drawn by the step view's graph widget); every FX graph."""
        import ipywidgets

        def graph_tabs(sides):
            children, titles = [], []
            for i, side in sides:
                g = self.fx_graphs[i]
                children.append(_graph_widget(g.graph))
                titles.append(f"graph {g.index}" + (f", {side}" if side else ""))  # a tab shows some 18 characters
                for which, c in _compiled(g):
                    children.append(ipywidgets.VBox([_html(splits_html(c)), _graph_widget(by_executable(c))]))
                    titles.append(f"graph {g.index}{which} in HLO")
            return _titled(ipywidgets.Tab(children=children), titles)

        table = _html(BREAK_STYLE + self._table_html(), style=True)
        rows = _titled(ipywidgets.Accordion(children=[
            ipywidgets.VBox([_html(reason_html(b) + source_html(b)), graph_tabs(_sides(b))]) for b in self.breaks]),
            [_row_title(b) for b in self.breaks])
        graphs = _titled(ipywidgets.Accordion(children=[graph_tabs([(g.index, "")]) for g in self.fx_graphs]),
                         [_graph_title(g) for g in self.fx_graphs])
        for accordion in (rows, graphs):
            accordion.selected_index = None  # rows start closed, as the static page's
        parts = [table] + ([_html("<h4>Graph breaks</h4>"), rows] if self.breaks else [])
        return ipywidgets.VBox(parts + [_html("<h4>FX graphs</h4>"), graphs])


def explain(fn, *args, **kwargs) -> BreakView:
    """Graph breaks of `fn(*args, **kwargs)` per path: Dynamo FX, Dynamo -> HLO,
    lazy, and torch_xla's when installed. Runs `fn` once per path. The report
    shows itself as text, HTML and a widget: a row per break that opens on its
    source, Dynamo's explanation and the FX graphs on either side of it."""
    return BreakView.of(breaks.explain(fn, *args, **kwargs))


def by_executable(c: CompiledGraph) -> GraphInfo:
    """The aten graph xlakit compiled, each node grouped under the executable it
    went to ("executable 1"), then under its module path where it has one."""
    nodes = tuple(dataclasses.replace(n, module=f"executable {n.partition or 0}" + (f".{n.module}" if n.module else ""))
                  for n in c.graph.nodes)
    return dataclasses.replace(c.graph, nodes=nodes)


def reason_html(b: GraphBreak) -> str:
    d = b.dynamo
    hints = "".join(f"<li>{html.escape(h)}</li>" for h in d.hints)
    plain = f"<b>{html.escape(d.plain)}</b><br>Dynamo's reason: " if d.plain else ""
    return (f"<div class='xlakit-dynamo'>{plain}<b>{html.escape(d.dynamo_words)}</b>"
            + (f": {html.escape(d.explanation)}" if d.explanation else "")
            + (f"<br>Dynamo saw: <code>{html.escape(d.context)}</code>" if d.context else "")
            + (f"<ul>{hints}</ul>" if hints else "") + "</div>")


def source_html(b: GraphBreak) -> str:
    if not b.lines:
        return f"<div>at {html.escape(b.at)} (its source is not readable here)</div>"
    width = len(str(b.lines[-1][0]))
    lines = "\n".join((f"<span class='at'>{n:>{width}} > {html.escape(text)}</span>" if n == b.where.line
                       else f"{n:>{width}}   {html.escape(text)}") for n, text in b.lines)
    return f"<div>at {html.escape(b.at)} in {html.escape(b.where.function)}</div><pre class='xlakit-source'>{lines}</pre>"


def splits_html(c: CompiledGraph) -> str:
    """Per executable of a compiled FX graph: its FX nodes, and what ended it."""
    cut_by = {c.partition.get(s.node): s for s in c.splits}  # a split node runs first in the executable after it
    rows = []
    for k in range(max(c.executables, 1)):
        names = [name for name, p in c.partition.items() if p == k]
        split = cut_by.get(k + 1)
        ended = (f"{split.reason} at {sources.describe(split.source) or '?'}: {split.op} ({split.node}): {split.why}"
                 if split is not None else "the graph's outputs")
        shown = ", ".join(names[:12]) + (f" ... ({len(names)})" if len(names) > 12 else "")
        rows.append(f"<tr><td>{k}</td><td>{html.escape(shown)}</td><td>{html.escape(ended)}</td></tr>")
    return ("<table class='xlakit-splits'><tr><th>executable</th><th>FX nodes</th><th>ended by</th></tr>"
            f"{''.join(rows)}</table>")


def _compiled(g: FxGraph) -> list[tuple[str, CompiledGraph]]:
    """What xlakit compiled of an FX graph: ("", its forward) and (" backward", its backward), where run."""
    return [(which, c) for which, c in (("", g.compiled), (" backward", g.backward)) if c is not None]


def _sides(b: GraphBreak) -> list[tuple[int, str]]:
    """The FX graphs on either side of a break: (index, "before" or "after")."""
    return [(b.before, "before")] + ([(b.after, "after")] if b.after is not None else [])


def _row_title(b: GraphBreak) -> str:
    return f"break {b.index} at {b.at} ({breaks.between(b)}): {b.dynamo}"


def _graph_title(g: FxGraph) -> str:
    return f"FX graph {g.index}: {len(g.graph.nodes)} ops" + "".join(
        f",{which} {_executables(c)}" for which, c in _compiled(g))


def _executables(c: CompiledGraph) -> str:
    n = c.executables
    return f"{n} executable{'s' if n != 1 else ''}, {len(c.splits)} HLO split{'s' if len(c.splits) != 1 else ''}"


def _svg(svgs: dict, g: FxGraph, which: str | None) -> str:
    """The SVG of an FX graph as Dynamo captured it (which=None), or of what xlakit
    compiled of it (which: "" its forward, " backward")."""
    key = (g.index, which)
    if key not in svgs:
        compiled = dict(_compiled(g)).get(which) if which is not None else None
        graph = by_executable(compiled) if compiled is not None else g.graph
        svgs[key] = f"<div class='graph'>{graph_dot.to_svg(graph_model.build(graph), graph)}</div>"
    return svgs[key]


def _graph_widget(graph: GraphInfo):
    from . import graph_widget

    return graph_widget.GraphWidget(graph=graph_widget.to_json(graph_model.build(graph)))


def _html(body: str, style: bool = False):
    """An HTML widget; the first carries the styles, which then hold for the whole page."""
    import ipywidgets

    return ipywidgets.HTML(f"{STYLE if style else ''}<div class='xlakit-step'>{body}</div>")


def _titled(widget, titles: list[str]):
    for i, title in enumerate(titles):  # ipywidgets 7 (Colab's) has no `titles` argument
        widget.set_title(i, title)
    return widget
