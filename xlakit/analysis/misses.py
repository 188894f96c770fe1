"""Why a step missed the cache: which key components changed since an earlier
step, and what in the graph, inputs or shardings made them change, in words."""
from __future__ import annotations

from ..core import sources
from ..core.sharding import MARK_SHARDING_NAME


def diff(new: dict[str, str], old: dict[str, str]) -> list[str]:
    """Names of the components that differ between two keys' components, in key order."""
    return [name for name in new if new[name] != old.get(name)]


def explain_miss(new: dict[str, str], new_graph, old: dict[str, str], old_graph, limit: int = 3,
                 settings: tuple[tuple, tuple] = ((), ())) -> list[str]:
    """Why a key with components `new` is not `old`, in words (graphs are GraphInfo);
    `settings`: the two keys' flag values (engine/keys.py), where known."""
    lines = []
    changed = diff(new, old)
    if {"graph", "inputs"} <= set(changed) and len(new_graph.params) != len(old_graph.params) and not any(
            a.aval == b.aval for a, b in zip(new_graph.params, old_graph.params)):
        # another number of inputs and none in common: listing the differences (9 lines for a
        # GPT-2 step against a 4-op one) describes another program, not a change
        return [f"a new graph: the closest cached step ({len(old_graph.nodes)} nodes, {len(old_graph.params)} "
                "inputs) has none of its input shapes at the same position"]
    if "inputs" in changed:
        lines += _differences("input", [p.aval for p in new_graph.params], [p.aval for p in old_graph.params],
                              limit)
    if "graph" in changed:
        new_nodes = [(n.op, n.avals, n.operands, n.args) for n in new_graph.nodes]
        old_nodes = [(n.op, n.avals, n.operands, n.args) for n in old_graph.nodes]
        for i, (a, b) in enumerate(zip(new_nodes, old_nodes)):
            if a[:3] == b[:3] and a != b:  # a constant argument changed
                node = new_graph.nodes[i]
                lines.append(f"node %{i} {node.op} now ({node.args}){_at(node.source)}, was ({b[3]})")
                break
            if a != b:
                node = new_graph.nodes[i]
                lines.append(f"node %{i} now {node.op} -> {', '.join(node.avals)}{_at(node.source)}, "
                             f"was {b[0]} -> {', '.join(b[1])}")
                break
        for i in range(len(old_nodes), min(len(new_nodes), len(old_nodes) + limit)):
            node = new_graph.nodes[i]
            lines.append(f"new node %{i} {node.op}{_at(node.source)}")
        if len(new_nodes) < len(old_nodes):
            lines.append(f"{len(old_nodes) - len(new_nodes)} fewer nodes ({len(new_nodes)}, was {len(old_nodes)})")
        if not lines:
            lines.append("same nodes, different wiring or outputs")
    if "donors" in changed:
        now = [i for i, p in enumerate(new_graph.params) if p.donated]
        was = [i for i, p in enumerate(old_graph.params) if p.donated]
        lines.append(f"donated inputs now {_numbers(now)}, was {_numbers(was)}")
    if "shardings" in changed and len(new_graph.params) == len(old_graph.params):
        lines += _sharding_differences(new_graph, old_graph, limit, alone=not {"graph", "inputs"} & set(changed))
    if "backend" in changed:
        lines.append("backend changed (compiler or platform)")
    if "flags" in changed:
        lines += _settings_differences(*settings) or ["flags changed (compiler, platform or settings)"]
    return lines


def _settings_differences(new: tuple, old: tuple) -> list[str]:
    """Each flag whose value differs, as "setting checks now 'on', was 'off'" (none if either is unknown)."""
    if not new or not old:
        return []
    new, old = dict(new), dict(old)
    return [f"setting {name} now {_short(new.get(name, 'unset'))}, was {_short(old.get(name, 'unset'))}"
            for name in sorted(new.keys() | old.keys()) if new.get(name) != old.get(name)]


def _short(value: str) -> str:
    return repr(value) if len(value) <= 40 else repr(value[:37] + "...")


def _sharding_differences(new_graph, old_graph, limit: int, alone: bool) -> list[str]:
    """Which input's sharding, or which mark_sharding in the graph, changed, from what to what.
    `alone`: nothing but shardings changed, so the same specs mean the mesh or an output differs."""
    lines = [f"input {i}{f' ({a.label})' if a.label else ''} sharding now {a.sharding}, was {b.sharding}"
             for i, (a, b) in enumerate(zip(new_graph.params, old_graph.params)) if a.sharding != b.sharding]
    lines += [f"node %{i} {a.op} now ({a.args}){_at(a.source)}, was ({b.args})"
              for i, (a, b) in enumerate(zip(new_graph.nodes, old_graph.nodes))
              if a.op == b.op == MARK_SHARDING_NAME and a.args != b.args]
    if lines or not alone:
        return lines[:limit]
    return ["the same partition specs: the mesh (shape, axis names or device order) or an output's requested "
            "sharding differs"]


def _differences(what: str, new: list, old: list, limit: int) -> list[str]:
    lines = [f"{what} {i} now {a}, was {b}" for i, (a, b) in enumerate(zip(new, old)) if a != b][:limit]
    if len(new) != len(old):
        lines.append(f"{len(new)} {what}s, was {len(old)}")
    return lines


def _at(source) -> str:
    return f" at {sources.describe(source)}" if source else ""


RUNS_SHOWN = 6


def _numbers(indices: list[int]) -> str:
    """'28 (2-7, 9, 17-21, ...)': how many, and the first runs of consecutive indices (a GPT-2
    training step listed its 80 donated inputs one by one)."""
    if not indices:
        return "none"
    runs = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:RUNS_SHOWN])
    return f"{len(indices)} ({shown}{', ...' if len(runs) > RUNS_SHOWN else ''})"
