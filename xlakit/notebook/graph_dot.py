"""The step graph as a static SVG, laid out by Graphviz `dot` (the `graphviz`
package drives it): one cluster per open module group, one box per closed
group, input and node. What a page without a kernel, and nbval, see.
Where `dot` is missing, graph_svg.py's own layout draws it instead.
"""
from __future__ import annotations

import re

from ..core.record import GraphInfo, StepRecord
from ..core.state import PROCESS, Last
from . import graph_svg
from .graph_model import GraphView, of_record, visible

FILL = {"input": "#e8f0fe", "node": "#ffffff", "group": "#f1f3f4"}
CLUSTER_FILLS = ("#f8f9fa", "#eef3fb", "#f3f8ef", "#fbf3ea")
# mark -> (border colour, dot style): the same marks and colours as the widget's
DONATED, SPLIT, OUTPUT, CHANGED_FILL = "#d93025", "#e37400", "#188038", "#fff3cd"


_LAST = PROCESS.keep("notebook.graph_dot: last svg", Last(), bound=1,
                     why="one step's display asks for its graph's SVG several times")


def step_svg(record: StepRecord, previous: StepRecord | None = None) -> str:
    """A step's graph; nodes changed since `previous` (the same cell's last step) marked."""
    view = of_record(record, previous)
    svg = _LAST.get(view)
    return svg if svg is not None else _LAST.put(to_svg(view, record.graph), view)


def to_svg(view: GraphView, graph: GraphInfo) -> str:
    """The SVG of `view` as first shown (its `expanded` groups open)."""
    try:
        import graphviz
    except ImportError:
        return _fallback(graph, "no graphviz package")
    try:
        svg = _dot(view, graphviz).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        return _fallback(graph, "no dot executable")
    start = svg.index("<svg")
    return svg[start:].replace("<svg ", f'<svg class="xlakit-graph" data-layout="dot" '
                                         f'data-grouped="{str(len(view.expanded) < len(view.groups)).lower()}" ', 1)


def _fallback(graph: GraphInfo, reason: str) -> str:
    return graph_svg.to_svg(graph).replace("<svg ", f'<svg data-layout="fallback ({reason})" ', 1)


def _dot(view: GraphView, graphviz):
    boxes, edges = visible(view, view.expanded)
    graph = graphviz.Digraph(graph_attr={"rankdir": "TB", "nodesep": "0.15", "ranksep": "0.3",
                                         "fontname": "monospace", "fontsize": "10"},
                             node_attr={"shape": "box", "style": "rounded,filled", "fontname": "monospace",
                                        "fontsize": "9", "margin": "0.06,0.03", "height": "0.3"},
                             edge_attr={"color": "#9aa0a6", "arrowsize": "0.5"})
    pending = {}  # open group -> its boxes, drawn inside the group's cluster
    for box, parent in boxes:
        pending.setdefault(parent, []).append(box)

    def draw(g, into, depth):
        for box in pending.get(g, []):
            into.node(_id(box), **_box_attrs(view, box))
        for c in view.groups[g].groups:
            if c in view.expanded:
                group = view.groups[c]
                with into.subgraph(name=f"cluster_g{c}") as cluster:
                    cluster.attr(label=_text(group.label), tooltip=_text(group.name), style="rounded,filled",
                                 fillcolor=CLUSTER_FILLS[depth % len(CLUSTER_FILLS)], color="#bdc1c6",
                                 fontname="monospace", fontsize="10", labeljust="l",
                                 **{"class": "xlakit-group open"})
                    draw(c, cluster, depth + 1)

    draw(0, graph, 0)
    if len(boxes) > 60:  # fewer crossing-minimization and placement passes: a large view in well under 1 s
        graph.graph_attr.update(mclimit="0.3", nslimit="2", nslimit1="2", remincross="false")
    for (a, b), count in edges.items():
        graph.edge(_id(a), _id(b), **({"penwidth": "1.6", "tooltip": f"{count} edges"} if count > 1 else {}))
    return graph


def _id(box) -> str:
    kind, index = box
    return f"{kind[0]}{index}"


def _box_attrs(view: GraphView, box) -> dict:
    kind, index = box
    if kind == "group":
        group = view.groups[index]
        marks = view.marks(index)
        members = [view.items[k] for k in view.members(index)]
        nodes = sum(m.kind == "node" for m in members)
        count = f"{nodes} ops" + (f", {len(members) - nodes} inputs" if len(members) > nodes else "")
        flags = {m: marks[m] > 0 for m in ("donated", "output", "split", "changed")}
        label = f"{_cut(group.label)}\n{count}" + "".join(f"\n{marks[m]} {m}" for m in ("donated", "changed")
                                                        if marks[m])
        return _styled(label, f"{group.name}: {count} (closed group)", "group", flags)
    item = view.items[index]
    source = item.library or item.user
    label = "\n".join(_cut(t) for t in (item.title, ", ".join(item.avals), source.split(" in ")[0]) if t)
    detail = "\n".join(t for t in (f"{item.op or item.title} -> {', '.join(item.avals)}", item.module,
                                   item.user, item.library, "donated" if item.donated else "",
                                   "the graph is split here" if item.split else "") if t)
    return _styled(label, detail, item.kind,
                   {m: getattr(item, m) for m in ("donated", "output", "split", "changed")})


def _styled(label: str, tooltip: str, kind: str, flags: dict) -> dict:
    border = DONATED if flags["donated"] else SPLIT if flags["split"] else OUTPUT if flags["output"] else "#5f6368"
    style = "rounded,filled" + (",dashed" if flags["split"] else "") + (",bold" if border != "#5f6368" else "")
    classes = " ".join(["xlakit-node", kind, *(m for m, on in flags.items() if on)])
    return {"label": _text(label), "tooltip": _text(tooltip), "color": border, "style": style,
            "fillcolor": CHANGED_FILL if flags["changed"] else FILL[kind], "class": classes}


_UNSAFE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _cut(text: str, width: int = 30) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _text(text: str) -> str:
    """Text as dot reads it literally: no control characters, no escapes (a backslash is one)."""
    return _UNSAFE.sub("", text).replace("\\", "\\\\")
