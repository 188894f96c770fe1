"""BreakReport -> static HTML and a widget: the views of xlakit.explain's report."""
from __future__ import annotations

import dataclasses
import html

from ..integrations import breaks
from ..integrations.breaks import BreakReport
from .graph_svg import to_svg
from .render import STYLE
from .views import Displayed


class BreakView(BreakReport, Displayed):
    """A BreakReport (the same data; `path()`, `paths`, `partitions`, `graphs`)
    that also shows itself: HTML table, and a widget with the FX graphs."""

    @classmethod
    def of(cls, report: BreakReport) -> BreakView:
        return cls(**{f.name: getattr(report, f.name) for f in dataclasses.fields(BreakReport)})

    def _repr_html_(self) -> str:
        """The table, then every FX graph drawn (a static page has no picker)."""
        graphs = "".join(f"<h4>FX graph {i}</h4><div class='graph'>{to_svg(g)}</div>"
                         for i, g in enumerate(self.graphs))
        return f"{STYLE}<div class='xlakit-step'>{self._table_html()}{graphs}</div>"

    def _table_html(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(p.path)}</td><td>{p.graphs}</td><td>{p.breaks}</td>"
                       f"<td>{'<br>'.join(html.escape(w) for w in p.why)}</td></tr>" for p in self.paths)
        return (f"<div>{html.escape(self.note)}</div><table class='xlakit-breaks'><tr><th>path</th>"
                f"<th>graphs</th><th>breaks</th><th>where and why</th></tr>{rows}</table>")

    def widget(self):
        """The table, and a picker of FX graphs showing each one's nodes by
        executable, with the split points outlined (dashed orange)."""
        import ipywidgets

        view = ipywidgets.HTML()
        picker = ipywidgets.Dropdown(options=[(f"FX graph {i}", i) for i in range(len(self.graphs))],
                                     description="graph")

        def show(change=None):
            if self.graphs:
                view.value = to_svg(self.graphs[picker.value])

        picker.observe(show, names="value")
        show()
        table = ipywidgets.HTML(f"{STYLE}<div class='xlakit-step'>{self._table_html()}</div>")
        return ipywidgets.VBox([table, picker, view])


def explain(fn, *args, **kwargs) -> BreakView:
    """Graph breaks of `fn(*args, **kwargs)` per path: Dynamo FX, Dynamo -> HLO,
    lazy, and torch_xla's when installed. Runs `fn` once per path. The report
    shows itself as a table, HTML, and a widget with the FX graphs."""
    return BreakView.of(breaks.explain(fn, *args, **kwargs))
