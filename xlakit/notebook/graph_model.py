"""A step's graph as the views draw it: its inputs and nodes ("items") in a
tree of groups by module path ("model.layers.3.self_attn" is model > layers >
3 > self_attn), with what each view marks: donated inputs, outputs, graph
splits, nodes changed since the previous step of the same cell, and the HLO
instructions each node became.

The static SVG (graph_dot.py) and the widget (static/graph.js) both draw this
tree; which groups start open is decided here, once, for both.
"""
from __future__ import annotations

import dataclasses
import difflib
import heapq
from collections import defaultdict

from ..core import sources
from ..core.hlo import parse as parse_hlo  # build() has an `hlo` argument
from ..core.record import GraphInfo, Output, StepRecord, Trigger
from ..core.state import PROCESS, Last

BUDGET = 120        # boxes a view shows at first; the rest stay in closed groups
MAX_CHILDREN = 100  # a group with more direct items is split by source line, then into runs
# a group with more subgroups has them bundled in runs, FAN_OUT a level: a flat nn.Sequential of
# 70 blocks (210 modules) had 212 boxes in its always-open root, 82 s in `dot`
MAX_GROUPS, FAN_OUT = 40, 10
MAX_HLO_LINES = 16  # of the HLO instructions a node became, the lines shown (all are named in StepRecord.hlo)


@dataclasses.dataclass
class Item:
    """One input or node of the graph."""

    kind: str                 # "input" or "node"
    title: str                # "%12 mm" or "input 3 0.weight"
    avals: tuple[str, ...]
    group: int
    preds: list[int]          # the items it reads (item indices)
    op: str = ""
    module: str = ""
    user: str = ""            # the user's line ("cell 4 line 3")
    library: str = ""         # the library line that recorded it ("modeling_llama.py:120 in forward")
    args: str = ""
    hlo: tuple[str, ...] = ()  # its optimized HLO instructions, as lines of StepRecord.hlo
    donated: bool = False
    output: bool = False
    split: bool = False
    changed: bool = False


@dataclasses.dataclass
class Group:
    name: str                 # full path ("model.layers.3"); "" for the whole graph
    label: str                # what its box says ("3", "modeling_llama.py:120", "items 1-100")
    parent: int | None
    groups: list[int] = dataclasses.field(default_factory=list)
    items: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class GraphView:
    items: list[Item]
    groups: list[Group]       # groups[0] is the root: the whole graph
    expanded: set[int]        # groups open at first (the root always)
    # the groups `expanded` adds to the root, in the order they were opened (numbered siblings
    # together): a view with less room closes the last ones first
    opened: list[list[int]] = dataclasses.field(default_factory=list)

    def marks(self, group: int) -> dict[str, int]:
        """How many items below `group` carry each mark: its closed box shows them."""
        counts = defaultdict(int)
        for i in self.members(group):
            item = self.items[i]
            for mark in ("donated", "output", "split", "changed"):
                counts[mark] += getattr(item, mark)
        return counts

    def members(self, group: int) -> list[int]:
        found, stack = [], [group]
        while stack:
            g = self.groups[stack.pop()]
            found += g.items
            stack += g.groups
        return found


def build(graph: GraphInfo, changed: set[int] = frozenset(), cut: set[int] = frozenset(),
          hlo: str | None = None, budget: int = BUDGET) -> GraphView:
    """The view of `graph`: `changed` are node numbers to mark as changed, `cut`
    the nodes where the graph was split (besides NodeInfo.split), `hlo` the
    executable's optimized HLO text."""
    hlo_lines = _hlo_lines(hlo)
    roots = {r.node for r in graph.roots}
    first_reader: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for w in node.operands:
            if isinstance(w, int):
                first_reader.setdefault(w, i)
    groups = [Group("", "", None)]
    by_name = {"": 0}

    def group_of(path: str) -> int:
        if path not in by_name:
            parent_path, _, label = path.rpartition(".")
            parent = group_of(parent_path)
            g = by_name[path] = len(groups)
            groups.append(Group(path, label, parent))
            groups[parent].groups.append(g)
        return by_name[path]

    offset = len(graph.params)
    items = []
    for i, p in enumerate(graph.params):
        reader = first_reader.get(i)
        module = graph.nodes[reader].module if reader is not None else ""
        items.append(Item("input", f"input {i}" + (f" {p.label}" if p.label else ""), (p.aval or "?",),
                          0, [], module=module, donated=p.donated))
    for i, n in enumerate(graph.nodes):
        items.append(Item(
            "node", f"%{i} {short_op(n.op)}", n.avals, 0,
            [w if isinstance(w, int) else offset + Output(*w).node for w in n.operands],
            op=n.op, module=n.module, args=n.args,
            user=sources.short(n.source.user) if n.source else "",
            library=(f"{sources.short(n.source.library)} in {n.source.library.function}"
                     if n.source and n.source.library else ""),
            hlo=_first_lines([hlo_lines.get(name, name) for name in n.hlo_ops]),
            output=i in roots, split=n.split or i in cut, changed=i in changed))
    for k, item in enumerate(items):
        item.group = group_of(item.module)
        groups[item.group].items.append(k)
    g = 0
    while g < len(groups):  # the groups of module paths, and those _split and _bundle append
        if len(groups[g].items) > MAX_CHILDREN:
            _split(groups, g, items)
        if len(groups[g].groups) > MAX_GROUPS:
            _bundle(groups, g)
        g += 1
    view = GraphView(items, groups, set())
    view.opened = _first_open(view, budget)
    view.expanded = {0, *(g for unit in view.opened for g in unit)}
    return view


def _split(groups: list[Group], g: int, items: list[Item], by_line: bool = True) -> None:
    """Too many items directly in one group: one group per source line where
    that gives fewer groups than items, else runs; as deep as it takes."""
    members = groups[g].items
    lines = defaultdict(list)
    for k in members:
        item = items[k]
        lines["inputs" if item.kind == "input" else (item.library or item.user or "?").split(" in ")[0]].append(k)
    if by_line and 1 < len(lines) <= MAX_CHILDREN:
        pieces = list(lines.items())
    else:
        run = max(MAX_CHILDREN, -(-len(members) // MAX_CHILDREN))
        pieces = [(f"items {s + 1}-{min(s + run, len(members))}", members[s:s + run])
                  for s in range(0, len(members), run)]
    groups[g].items = []
    for label, ks in pieces:
        child = len(groups)
        groups.append(Group(f"{groups[g].name}[{label}]", label, g, items=ks))
        groups[g].groups.append(child)
        for k in ks:
            items[k].group = child
        if len(ks) > MAX_CHILDREN:
            _split(groups, child, items, by_line=False)


def _bundle(groups: list[Group], g: int) -> None:
    """Too many subgroups in one group: FAN_OUT runs of them ("0-20", "21-41", ...); a run
    still too large is bundled in its turn, when build() comes to it."""
    children = groups[g].groups
    run = -(-len(children) // FAN_OUT)
    groups[g].groups = []
    for s in range(0, len(children), run):
        members = children[s:s + run]
        label = f"{groups[members[0]].label}-{groups[members[-1]].label}"
        bundle = len(groups)
        groups.append(Group(f"{groups[g].name}[{label}]", label, g, groups=members))
        groups[g].groups.append(bundle)
        for c in members:
            groups[c].parent = bundle


def _first_open(view: GraphView, budget: int) -> list[list[int]]:
    """The units of groups to open, in order, while the boxes shown stay within budget: shallow ones
    first, and of those the ones that add the fewest boxes. Numbered siblings
    (a ModuleList's blocks: layers.0, layers.1, ...) open all or none, so
    repeated blocks look alike."""
    groups = view.groups
    shown = len(groups[0].items) + len(groups[0].groups)
    opened, queue, depth = [], [], {0: 0}

    def offer(g):
        numbered = [c for c in groups[g].groups if groups[c].label.isdigit()]
        units = [[c] for c in groups[g].groups if c not in numbered] + ([numbered] if numbered else [])
        for unit in units:
            more = sum(len(groups[c].items) + len(groups[c].groups) - 1 for c in unit)
            heapq.heappush(queue, (depth[g] + 1, more, unit))

    offer(0)
    while queue:
        level, more, unit = heapq.heappop(queue)
        if shown + more <= budget:
            opened.append(unit)
            shown += more
            for g in unit:
                depth[g] = level
                offer(g)
    return opened


def visible(view: GraphView, expanded: set[int]):
    """What a view with `expanded` groups open shows: the boxes, each as
    (("item", k) or ("group", g), the open group it sits in), in tree order;
    and the edges between boxes, with how many item edges each stands for."""
    owner, boxes = {}, []  # owner: item -> the box that shows it

    def walk(g):
        for k in view.groups[g].items:
            owner[k] = ("item", k)
            boxes.append((("item", k), g))
        for c in view.groups[g].groups:
            if c in expanded:
                walk(c)
            else:
                boxes.append((("group", c), g))
                owner.update((k, ("group", c)) for k in view.members(c))

    walk(0)
    edges = defaultdict(int)
    for k, item in enumerate(view.items):
        for p in item.preds:
            a, b = owner[p], owner[k]
            if a != b:
                edges[(a, b)] += 1
    return boxes, dict(edges)


def changed_nodes(graph: GraphInfo, previous: GraphInfo | None) -> set[int]:
    """Nodes of `graph` with no equal in `previous`, matched in order
    (difflib's longest matching blocks): an inserted node marks itself, not
    every node after it. A node equals another with the same op, arguments,
    avals and operands (inputs by aval, nodes by distance back)."""
    if previous is None:
        return set()
    new, old = _signatures(graph), _signatures(previous)
    if new == old:
        return set()
    matcher = difflib.SequenceMatcher(None, new, old, autojunk=False)
    same = {i for a, _, size in matcher.get_matching_blocks() for i in range(a, a + size)}
    return set(range(len(new))) - same


def _signatures(graph: GraphInfo) -> list[tuple]:
    def wire(i, w):
        return ("input", graph.params[w].aval) if isinstance(w, int) else (i - w.node, w.output)
    return [(n.op, n.args, n.avals, tuple(wire(i, w) for w in n.operands)) for i, n in enumerate(graph.nodes)]


def _first_lines(lines: list[str]) -> tuple[str, ...]:
    if len(lines) <= MAX_HLO_LINES:
        return tuple(lines)
    return (*lines[:MAX_HLO_LINES - 1], f"... and {len(lines) - MAX_HLO_LINES + 1} more in the step's HLO")


def short_op(op: str) -> str:
    """'aten.mm.default' -> 'mm'; 'aten.add.Tensor' -> 'add.Tensor'."""
    return op.removeprefix("aten.").removesuffix(".default")


def _hlo_lines(text: str | None) -> dict[str, str]:
    """Instruction name -> its line without metadata, and the fusion it is in."""
    instructions = parse_hlo(text).instructions.values()
    caller = {called: i.name for i in instructions for called in i.called("calls")}  # a fusion's body -> the fusion
    lines = {}
    for i in instructions:
        fusion = f"  (in {caller[i.computation]})" if i.computation in caller else ""
        lines[i.name] = f"{i.name} = {i.definition}"[:160] + fusion
    return lines


# a step with this trigger computed only what one line asked for: the graph is cut at its outputs
_CUTTING = (Trigger.ITEM, Trigger.CPU, Trigger.FALLBACK, Trigger.SAVE)


_LAST = PROCESS.keep("notebook.graph_model: last view", Last(), bound=1,
                     why="one step's display asks for its graph view several times")


def of_record(record: StepRecord, previous: StepRecord | None = None) -> GraphView:
    """The view of a step's graph; nodes changed since `previous` (the same cell's last step) marked.
    One step's display asks for it several times (its HTML, its widget): the last one is kept."""
    view = _LAST.get(record, previous)
    if view is not None:
        return view
    same_kind = previous is not None and previous.backend == record.backend
    changed = changed_nodes(record.graph, previous.graph) if same_kind else set()
    cut = {r.node for r in record.graph.roots} if record.trigger in _CUTTING else set()
    return _LAST.put(build(record.graph, changed, cut, record.hlo), record, previous)
