"""Displayable objects: plain text, static HTML and (where ipywidgets runs) a tabbed widget."""
from __future__ import annotations

from ..core.record import StepRecord
from . import render


class Displayed:
    """Every view's display: plain text, static HTML and, where ipywidgets runs, its widget."""

    def _ipython_display_(self):
        """Two outputs where ipywidgets runs: the widget, then the plain text and static HTML.

        One output with both would lose the static HTML wherever the widget's state was saved
        (nbclient's and docs builders' default): nbconvert then writes only the widget's
        placeholder, empty on a page without scripts. So the static HTML is an output of its
        own, and a CSS rule hides it once this widget renders (it then carries a class named
        after its model): a live frontend and a page whose scripts draw the widgets show the
        view once, a page whose widgets do not render shows the static HTML."""
        from IPython.display import display

        try:
            widget = self.widget()
        except ImportError:  # no ipywidgets: the static HTML stands alone
            display({"text/plain": repr(self), "text/html": self._repr_html_()}, raw=True)
            return
        marker = f"xlakit-widget-{widget.model_id}"
        widget.add_class(marker)
        # where the widget cannot render (no state, no frontend) its output is empty: the next one shows the view
        data, metadata = _widget_bundle(widget)
        display({**{k: v for k, v in data.items() if k != "text/plain"}, "text/html": ""}, metadata=metadata,
                raw=True)
        display({"text/plain": repr(self), "text/html": _hidden_once_drawn(marker, self._repr_html_())}, raw=True)


def _hidden_once_drawn(marker: str, page: str) -> str:
    """`page` in a box that a CSS rule hides, with the output holding it (JupyterLab's and
    Notebook 7's output box, classic nbconvert's), once an element of class `marker` is drawn."""
    box = f"{marker}-html"
    rule = ",".join(f":root:has(.{marker}) {where}" for where in (
        f".jp-OutputArea-child:has(>.jp-OutputArea-output>.{box})", f".output_area:has(>.output_subarea>.{box})",
        f".{box}"))
    return f'<div class="{box}"><style>{rule}{{display:none}}</style>{page}</div>'


def _widget_bundle(widget) -> tuple[dict, dict]:
    """A widget's display data and metadata: an anywidget widget gives both (on Colab the
    metadata names its widget manager), another of ipywidgets 8 the data; ipywidgets 7's
    (Colab's 7.7.1) display themselves instead, with this widget-view entry."""
    if not hasattr(widget, "_repr_mimebundle_"):
        return {"application/vnd.jupyter.widget-view+json":
                {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}}, {}
    bundle = widget._repr_mimebundle_()
    return bundle if isinstance(bundle, tuple) else (bundle, {})


class StepView(Displayed):
    def __init__(self, record: StepRecord, name: str | None = None, previous: StepRecord | None = None,
                 hlo: bool = False):
        self.record, self.name, self.previous, self.hlo = record, name, previous, hlo

    def __repr__(self) -> str:
        return render.text(self.record, self.name, self.previous)

    def _repr_html_(self) -> str:
        return render.html_view(self.record, self.name, self.previous, self.hlo)

    def widget(self):
        from . import step_widget

        return step_widget.of_record(self.record, self.name, self.previous, self.hlo)


class HistoryView:
    def __init__(self, rows: list[tuple[str, StepRecord]]):
        self.rows = list(rows)

    def __repr__(self) -> str:
        return render.history_text(self.rows)

    def _repr_html_(self) -> str:
        return render.history_html(self.rows)
