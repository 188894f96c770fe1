"""The step graph as a static SVG, laid out by Graphviz `dot` (the `graphviz`
package drives it): one cluster per open module group, one box per closed
group, input and node, as wide as a page at its own size (a page squeezes a
wider SVG to its width: a Llama step's 13468 px drawing read as 1-2 px text);
below it every module group as a `<details>` with its ops. What a page without
a kernel, and nbval, see. Where `dot` is missing, graph_svg.py's own layout
draws it instead.
"""
from __future__ import annotations

import html
import re

from ..core.record import GraphInfo, StepRecord
from ..core.state import PROCESS, Last
from . import graph_svg
from .graph_model import GraphView, of_record, visible

FILL = {"input": "#e8f0fe", "node": "#ffffff", "group": "#f1f3f4"}
CLUSTER_FILLS = ("#f8f9fa", "#eef3fb", "#f3f8ef", "#fbf3ea")
# mark -> (border colour, dot style): the same marks and colours as the widget's
DONATED, SPLIT, OUTPUT, CHANGED_FILL = "#d93025", "#e37400", "#188038", "#fff3cd"
PAGE_WIDTH_PT = 720  # 960 px: a notebook's output at a 1400 px window, at dot's 9 pt (12 px) text
MAX_ROWS = 2000      # of the groups and their tables below the drawing, the rows written (the widget has all)


_LAST = PROCESS.keep("notebook.graph_dot: last svg", Last(), bound=1,
                     why="one step's display asks for its graph's SVG several times")


def step_svg(record: StepRecord, previous: StepRecord | None = None) -> str:
    """A step's graph; nodes changed since `previous` (the same cell's last step) marked."""
    view = of_record(record, previous)
    svg = _LAST.get(view)
    return svg if svg is not None else _LAST.put(to_svg(view, record.graph), view)


def step_html(record: StepRecord, previous: StepRecord | None = None) -> str:
    """The drawing, in a box that scrolls, then the groups' `<details>`."""
    return f'<div class="graph">{step_svg(record, previous)}</div>{groups_html(of_record(record, previous))}'


def to_svg(view: GraphView, graph: GraphInfo) -> str:
    """The SVG of `view` as first shown: its `expanded` groups open, less the last half opened
    if the drawing is wider than a page, and all but the root if it still is (or was more than
    twice as wide): at most 3 `dot` runs."""
    try:
        import graphviz
    except ImportError:
        return _fallback(graph, "no graphviz package")
    units = len(view.opened)
    while True:
        expanded = {0, *(g for unit in view.opened[:units] for g in unit)}
        try:
            svg = _dot(view, expanded, graphviz).pipe(format="svg", encoding="utf-8")
        except graphviz.ExecutableNotFound:
            return _fallback(graph, "no dot executable")
        svg = svg[svg.index("<svg"):]
        width = float(re.search(r'width="([\d.]+)pt"', svg)[1])
        if units == 0 or width <= PAGE_WIDTH_PT:
            break
        # half the groups drew at most about half as wide (20,000-node chains: 2992 pt to 1630, 2609 to 1681,
        # 2803 to 2264): more than twice a page, only the root can fit
        units = units // 2 if units == len(view.opened) and width <= 2 * PAGE_WIDTH_PT else 0
    # max-width: a wider drawing (a root of 100 boxes) scrolls in its box, its text kept at its size
    return svg.replace("<svg ", f'<svg class="xlakit-graph" data-layout="dot" style="max-width:none" '
                                f'data-grouped="{str(len(expanded) < len(view.groups)).lower()}" ', 1)


def groups_html(view: GraphView) -> str:
    """Each module group as a `<details>` (nested as the groups are) with a table of its own
    inputs and ops: what a closed box of the drawing holds, without a script."""
    rows = 0

    def group(g: int) -> str:
        nonlocal rows
        rows += 1
        members = view.members(g)
        nodes = sum(view.items[k].kind == "node" for k in members)
        parts = [f"<details><summary>{html.escape(view.groups[g].name or 'graph')}: {nodes} ops"
                 f"{f', {len(members) - nodes} inputs' if len(members) > nodes else ''}</summary>"]
        own = view.groups[g].items[:max(0, MAX_ROWS - rows)]
        rows += len(own)
        if own:
            parts.append("<table><tr><th>node</th><th>shapes</th><th>line</th></tr>")
            parts += [f"<tr><td>{html.escape(item.title)}</td><td>{html.escape(', '.join(item.avals))}</td>"
                      f"<td>{html.escape(item.library or item.user)}</td></tr>"
                      for item in (view.items[k] for k in own)]
            parts.append("</table>")
        if len(own) < len(view.groups[g].items):
            parts.append(f"<p>{len(view.groups[g].items) - len(own)} more: the interactive view shows them</p>")
        children = view.groups[g].groups
        shown = [group(c) for c in children[:max(0, MAX_ROWS - rows)]]
        if len(shown) < len(children):
            parts.append(f"<p>{len(children) - len(shown)} more groups: the interactive view shows them</p>")
        parts += [*shown, "</details>"]
        return "".join(parts)

    return f'<div class="xlakit-graph-groups">{group(0)}</div>'


def _fallback(graph: GraphInfo, reason: str) -> str:
    return graph_svg.to_svg(graph).replace("<svg ", f'<svg data-layout="fallback ({reason})" ', 1)


def _dot(view: GraphView, expanded: set[int], graphviz):
    boxes, edges = visible(view, expanded)
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
            if c in expanded:
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
    # an input's label less its group's path, which the cluster's title shows: narrower boxes
    path = view.groups[item.group].name
    title = item.title.replace(f" {path}.", " ", 1) if path and item.kind == "input" else item.title
    label = "\n".join(_cut(t) for t in (title, ", ".join(item.avals), source.split(" in ")[0]) if t)
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
