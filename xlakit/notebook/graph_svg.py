"""Draw a step's IR graph as SVG, with our own layered layout.

Written by hand because it must draw without system Graphviz (a laptop may
lack `dot`), stay deterministic for tests and notebooks, and group graphs of
thousands of nodes into a bounded number of boxes so a page never freezes.
"""
from __future__ import annotations

import dataclasses
import html
from collections import defaultdict

from ..core import sources
from ..core.record import GraphInfo

MAX_BOXES = 300
BOX_W, BOX_H, GAP_X, GAP_Y = 170, 46, 24, 40


@dataclasses.dataclass
class Box:
    kind: str                  # "param", "node" or "group"
    title: str                 # first line: op name, input label, or group name
    subtitle: str              # second line: aval(s) or op count
    detail: str                # tooltip
    source: str = ""           # third line: the line that recorded it (the library's, if any)
    donated: bool = False
    output: bool = False
    split: bool = False
    preds: set = dataclasses.field(default_factory=set)


def boxes_for(graph: GraphInfo, max_boxes: int = MAX_BOXES) -> tuple[list[Box], bool]:
    """One box per input and node; or, for large graphs, one per source line
    (or per function, or per run of nodes) with a count. Returns (boxes, grouped)."""
    params = [Box("param", f"input {i}" + (f" {p.label}" if p.label else ""), p.aval or "",
                  f"input {i}: {p.label or 'unlabelled'} {p.aval or ''}" + (" (donated)" if p.donated else ""),
                  donated=p.donated)
              for i, p in enumerate(graph.params)]
    outputs = {r.node for r in graph.roots}
    if len(graph.params) + len(graph.nodes) <= max_boxes:
        nodes = []
        for i, n in enumerate(graph.nodes):
            where = "" if n.partition is None else f"executable {n.partition}: "
            box = Box("node", f"%{i} {n.op.removeprefix('aten.').removesuffix('.default')}",
                      where + ", ".join(n.avals),
                      f"%{i} {n.op} -> {', '.join(n.avals)}\n{where}{sources.describe(n.source)}"
                      + ("\nthe graph is split here" if n.split else ""),
                      source=_innermost(n.source), output=i in outputs, split=n.split)
            for w in n.operands:
                box.preds.add(w if isinstance(w, int) else len(params) + w.node)
            nodes.append(box)
        return params + nodes, False
    return params + _grouped(graph, len(params), outputs, max_boxes - len(params)), True


def _grouped(graph: GraphInfo, offset: int, outputs: set, budget: int) -> list[Box]:
    budget = max(budget, 1)
    count = len(graph.nodes)
    groupings = (
        lambda i, n: sources.describe(n.source) or "?",                 # by source line
        lambda i, n: _function(n.source),                               # by function
        lambda i, n: f"nodes {i * budget // count * count // budget}+",  # by runs of nodes
    )
    for grouping in groupings:
        group_of, names = {}, {}
        for i, n in enumerate(graph.nodes):
            group_of[i] = names.setdefault(grouping(i, n), len(names))
        if len(names) <= budget:
            break
    members = defaultdict(list)
    for i, g in group_of.items():
        members[g].append(i)
    boxes = []
    for name, g in names.items():
        ops = defaultdict(int)
        for i in members[g]:
            ops[graph.nodes[i].op.removeprefix("aten.")] += 1
        top = ", ".join(f"{op} x{c}" for op, c in sorted(ops.items(), key=lambda kv: -kv[1])[:5])
        box = Box("group", str(name)[:40],
                  f"{len(members[g])} ops", f"{name}\n{len(members[g])} ops: {top}",
                  output=any(i in outputs for i in members[g]))
        for i in members[g]:
            for w in graph.nodes[i].operands:
                if isinstance(w, int):
                    box.preds.add(w)
                elif group_of[w.node] != g:
                    box.preds.add(offset + group_of[w.node])
        boxes.append(box)
    return boxes


def _recording_frame(source):
    """The line that recorded a node: the library's when there is one."""
    return source and (source.library or source.user)


def _innermost(source) -> str:
    return sources.short(_recording_frame(source))


def _function(source) -> str:
    frame = _recording_frame(source)
    return frame.function if frame else "?"


def layout(boxes: list[Box]) -> list[tuple[float, float]]:
    """Layer by longest path from the inputs; order each layer by the mean
    position of its predecessors (one barycenter pass)."""
    layer = [0] * len(boxes)
    for i, b in enumerate(boxes):  # boxes are in topological order
        layer[i] = max((layer[p] + 1 for p in b.preds if p < i), default=0)
    rows = defaultdict(list)
    for i, lv in enumerate(layer):
        rows[lv].append(i)
    pos: dict[int, float] = {}
    for lv in sorted(rows):
        members = rows[lv]
        members.sort(key=lambda i: (sum(pos.get(p, 0) for p in boxes[i].preds) / len(boxes[i].preds)
                                    if boxes[i].preds else 0.0, i))
        for order, i in enumerate(members):
            pos[i] = float(order)
    return [(pos[i] * (BOX_W + GAP_X), layer[i] * (BOX_H + GAP_Y)) for i in range(len(boxes))]


def to_svg(graph: GraphInfo, max_boxes: int = MAX_BOXES) -> str:
    boxes, grouped = boxes_for(graph, max_boxes)
    coords = layout(boxes)
    width = max((x for x, _ in coords), default=0) + BOX_W + 2 * GAP_X
    height = max((y for _, y in coords), default=0) + BOX_H + 2 * GAP_Y
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="xlakit-graph" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'data-grouped="{str(grouped).lower()}" font-family="monospace" font-size="11">']
    for i, b in enumerate(boxes):
        x2, y2 = coords[i]
        for p in sorted(b.preds):
            x1, y1 = coords[p]
            out.append(f'<line x1="{x1 + GAP_X + BOX_W / 2:.0f}" y1="{y1 + GAP_Y + BOX_H:.0f}" '
                       f'x2="{x2 + GAP_X + BOX_W / 2:.0f}" y2="{y2 + GAP_Y:.0f}" stroke="#999"/>')
    for i, b in enumerate(boxes):
        x, y = coords[i][0] + GAP_X, coords[i][1] + GAP_Y
        fill = {"param": "#e8f0fe", "node": "#ffffff", "group": "#f3f3f3"}[b.kind]
        stroke = "#d93025" if b.donated else ("#e37400" if b.split else ("#188038" if b.output else "#5f6368"))
        width_px = 3 if (b.donated or b.output or b.split) else 1
        dash = ' stroke-dasharray="6 3"' if b.split else ""
        classes = " ".join(c for c, on in (("xlakit-node", True), (b.kind, True), ("donated", b.donated),
                                           ("output", b.output), ("split", b.split)) if on)
        out.append(f'<g class="{classes}" data-index="{i}"><title>{html.escape(b.detail)}</title>'
                   f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="4" fill="{fill}" '
                   f'stroke="{stroke}" stroke-width="{width_px}"{dash}/>')
        for k, text in enumerate((b.title, b.subtitle, b.source)):
            if text:
                out.append(f'<text x="{x + 6:.0f}" y="{y + 14 + 13 * k:.0f}">{html.escape(text[:26])}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
