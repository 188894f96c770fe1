"""How a step's inputs and outputs lie on the mesh: an N-D device grid per tensor
(any number of dims; JAX's visualize_array_sharding draws 1-D and 2-D only),
the collectives XLA inserted, memory per device, and a warning when large
tensors are whole on every device. Plain text and static HTML, from the
StepRecord alone.
"""
from __future__ import annotations

import collections
import html
import itertools
import math

from .. import session
from ..core.record import MeshInfo, StepRecord, TensorSharding
from . import panels
from .units import human_bytes

# A tensor at least this big, whole on every device of a mesh, is worth a warning.
LARGE_BYTES = 1 << 20
# Grids drawn per tensor: a tensor split along many leading dims has one per leading block.
MAX_GRIDS = 16
# Blocks listed per tensor in the text view.
MAX_BLOCKS = 64

STYLE = """<style>
.xlakit-sharding table{border-collapse:collapse;font-family:monospace;font-size:12px;margin:4px 0}
.xlakit-sharding td,.xlakit-sharding th{border:1px solid #ccc;padding:2px 6px;text-align:left!important}
.xlakit-sharding table{margin-left:0!important}
.xlakit-sharding table.grid td{text-align:center!important;min-width:22px;padding:0 4px;font-size:10px;line-height:13px}
.xlakit-sharding .warn{color:#a50e0e}.xlakit-sharding .grids{display:flex;flex-wrap:wrap;gap:8px}
.xlakit-sharding h4{margin:8px 0 2px 0}.xlakit-sharding .note{color:#666;font-size:11px}
</style>"""
_COLORS = ["#e8f0fe", "#fce8e6", "#e6f4ea", "#fef7e0", "#f3e8fd", "#e4f7fb", "#fde7f3", "#eceff1"]


def blocks(mesh: MeshInfo, axes: tuple[tuple[str, ...], ...]) -> dict[tuple[int, ...], list[int]]:
    """Per block of the tensor (its index along each dim), the ids of the devices that hold it.
    A dim split over mesh axes (a, b) is cut into size(a) * size(b) blocks, a major."""
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    held: dict[tuple[int, ...], list[int]] = {}
    for device, coords in zip(mesh.devices, itertools.product(*(range(n) for n in mesh.shape))):
        at = dict(zip(mesh.axis_names, coords))
        block = []
        for dim_axes in axes:
            index = 0
            for a in dim_axes:
                index = index * sizes[a] + at[a]
            block.append(index)
        held.setdefault(tuple(block), []).append(device)
    return held


def pieces(mesh: MeshInfo, axes: tuple[tuple[str, ...], ...]) -> tuple[int, ...]:
    """Blocks along each dim."""
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    return tuple(math.prod(sizes[a] for a in dim_axes) for dim_axes in axes)


def large_replicated(record: StepRecord, large: int = LARGE_BYTES) -> list[str]:
    """The inputs and outputs of at least `large` bytes that are whole on every device of a mesh."""
    info = record.shardings
    if info is None or info.mesh.size < 2:
        return []
    return [f"{name} {t.aval}" for name, t in _named(record) if t.replicated and t.nbytes >= large]


def _warning(record: StepRecord, large: int) -> str | None:
    found = large_replicated(record, large)
    if not found:
        return None
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    inputs = sum(name.startswith("input ") for name in found)
    return (f"{inputs} input(s) and {len(found) - inputs} output(s) of {human_bytes(large)} or more are "
            "replicated, whole on each of the "
            f"{record.shardings.mesh.size} devices: {shown}. Split them with mark_sharding or xlakit.shard_module.")


def _named(record: StepRecord) -> list[tuple[str, TensorSharding]]:
    """(name, sharding) of each input (by its label) and output (by the node that computes it)."""
    info, graph = record.shardings, record.graph
    named = [(f"input {i}" + (f" {p.label}" if p.label else ""), t) for i, (p, t) in enumerate(zip(graph.params,
                                                                                                  info.inputs))]
    named += [(f"output {k} (%{root.node} {graph.nodes[root.node].op})", t)
              for k, (root, t) in enumerate(zip(graph.roots, info.outputs))]
    return named


# -- text -------------------------------------------------------------------------
def text(record: StepRecord, large: int = LARGE_BYTES) -> str:
    info = record.shardings
    if info is None:
        return f"sharding of step {record.index}: one device, nothing sharded"
    mesh = info.mesh
    lines = [f"sharding of step {record.index}: mesh ({_axes_text(mesh)}), devices {list(mesh.devices)}"]
    warning = _warning(record, large)
    if warning:
        lines.append(f"  WARNING: {warning}")
    shown, rest = _shown(record, large)
    for name, t in shown:
        line = f"  {name} {t.aval} {t.spec}: {human_bytes(t.shard_bytes)} per device"
        if t.axes is not None and not t.replicated:
            line += "; " + _blocks_text(mesh, t.axes)
        lines.append(line)
    if rest:
        lines.append(f"  {_rest_text(rest, large)}")
    lines += ["  " + line for line in _collective_lines(record)]
    lines += [f"  memory: {line}" for line in panels.memory_lines(record)]
    return "\n".join(lines)


def summary_lines(record: StepRecord) -> list[str]:
    """The step view's sharding lines: mesh, how many inputs and outputs are split, memory per
    device and collectives; none on one device."""
    info = record.shardings
    if info is None:
        return []
    split = [sum(not t.replicated for t in group) for group in (info.inputs, info.outputs)]
    lines = [f"mesh ({_axes_text(info.mesh)}) over {info.mesh.size} devices; split: {split[0]} of "
             f"{len(info.inputs)} inputs, {split[1]} of {len(info.outputs)} outputs (the rest replicated)"]
    if record.memory is not None:
        lines.append(f"per device: peak {human_bytes(record.memory.peak)}, "
                     f"arguments {human_bytes(record.memory.arguments)}")
    counts = {op: len(found) for op, found in _by_op(record).items()}
    lines.append("collectives: " + (", ".join(f"{n} {op}" for op, n in counts.items()) or "none")
                 + (f", {human_bytes(sum(c.nbytes for c in record.collectives))}" if counts else ""))
    return lines


def _shown(record: StepRecord, large: int) -> tuple[list, list]:
    """(split or large tensors, smaller replicated ones): the first are listed, the rest summed up."""
    shown, rest = [], []
    for name, t in _named(record):
        (rest if t.replicated and t.nbytes < large else shown).append((name, t))
    return shown, rest


def _rest_text(rest: list, large: int) -> str:
    return (f"{len(rest)} more tensor(s), each under {human_bytes(large)}, replicated: "
            f"{human_bytes(sum(t.shard_bytes for _, t in rest))} per device")


def _blocks_text(mesh: MeshInfo, axes) -> str:
    """"blocks 2x1x4: 0 | 1 | ... | 7": the devices holding each block, blocks in row-major order."""
    held = sorted(blocks(mesh, axes).items())
    shown = " | ".join(",".join(map(str, devices)) for _, devices in held[:MAX_BLOCKS])
    more = f" | ... {len(held) - MAX_BLOCKS} more" if len(held) > MAX_BLOCKS else ""
    return f"blocks {'x'.join(map(str, pieces(mesh, axes)))}: {shown}{more}"


def _collective_lines(record: StepRecord) -> list[str]:
    if not record.collectives:
        return ["collectives: none (every device computes its part alone)"]
    lines = [f"collectives: {len(record.collectives)}, "
             f"{human_bytes(sum(c.nbytes for c in record.collectives))} per device"]
    for op, found in _by_op(record).items():
        groups = sorted({c.group_size for c in found if c.group_size is not None})
        lines.append(f"  {op} x{len(found)}: {human_bytes(sum(c.nbytes for c in found))}"
                     + (f", groups of {'/'.join(map(str, groups))}" if groups else ""))
    return lines


def _by_op(record: StepRecord) -> dict[str, list]:
    found = collections.defaultdict(list)
    for c in record.collectives:
        found[c.op].append(c)
    return dict(sorted(found.items()))


# -- HTML ---------------------------------------------------------------------------
def html_view(record: StepRecord, large: int = LARGE_BYTES) -> str:
    if record.shardings is None:
        return _wrap(f"<div>step {record.index}: one device, nothing sharded</div>")
    return _wrap(_tensors_html(record, large) + _collectives_html(record) + _memory_html(record))


def sections(record: StepRecord, large: int = LARGE_BYTES) -> list[tuple[str, str]]:
    """(title, html) for the step view's tabs; none for a step on one device."""
    if record.shardings is None:
        return []
    return [("Sharding", _wrap(_tensors_html(record, large))),
            ("Collectives and memory", _wrap(_collectives_html(record) + _memory_html(record)))]


def _wrap(body: str) -> str:
    return f'{STYLE}<div class="xlakit-sharding">{body}</div>'


def _tensors_html(record: StepRecord, large: int) -> str:
    info = record.shardings
    mesh = info.mesh
    parts = [f"<h4>Mesh ({html.escape(_axes_text(mesh))})</h4>", _mesh_grid(mesh)]
    warning = _warning(record, large)
    if warning:
        parts.append(f'<div class="warn">&#9888; {html.escape(warning)}</div>')
    shown, rest = _shown(record, large)
    parts.append("<h4>Inputs and outputs</h4>" + _tensor_table(mesh, shown, "blocks: devices holding each"))
    if rest:
        parts.append(f"<details><summary>{html.escape(_rest_text(rest, large))}</summary>"
                     f"{_tensor_table(mesh, rest, '')}</details>")
    return "".join(parts)


def _tensor_table(mesh: MeshInfo, tensors: list, blocks_title: str) -> str:
    rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{t.aval}</td><td>{html.escape(t.spec)}</td>"
                   f"<td>{human_bytes(t.shard_bytes)}</td><td>{_tensor_grids(mesh, t)}</td></tr>"
                   for name, t in tensors)
    return (f"<table><tr><th>tensor</th><th>shape</th><th>spec</th><th>per device</th><th>{blocks_title}</th></tr>"
            f"{rows}</table>")


def _mesh_grid(mesh: MeshInfo) -> str:
    """The mesh itself: device ids on a grid of its last two axes, one grid per index of the others."""
    shape = mesh.shape if len(mesh.shape) >= 2 else (1, *mesh.shape)
    rows, cols = shape[-2], shape[-1]
    per_grid = rows * cols
    grids = []
    for g, outer in enumerate(itertools.product(*(range(n) for n in shape[:-2]))):
        ids = mesh.devices[g * per_grid:(g + 1) * per_grid]
        body = "".join("<tr>" + "".join(f"<td>{ids[r * cols + c]}</td>" for c in range(cols)) + "</tr>"
                       for r in range(rows))
        title = ", ".join(f"{html.escape(a)}={i}" for a, i in zip(mesh.axis_names, outer))
        grids.append(f'<div><div class="note">{title}</div><table class="grid">{body}</table></div>')
    names = mesh.axis_names[-2:] if len(mesh.axis_names) >= 2 else ("", *mesh.axis_names)
    note = f'<div class="note">rows: {html.escape(names[0] or "-")}, columns: {html.escape(names[1])}</div>'
    return f'<div class="grids">{"".join(grids)}</div>{note}'


def _tensor_grids(mesh: MeshInfo, t: TensorSharding) -> str:
    """One grid per block of the leading dims; rows and columns: blocks of the last two dims.
    Each cell lists the devices holding that block, colored by block."""
    if t.axes is None:
        return f'<span class="note">{html.escape(t.spec)}</span>'
    if t.replicated:
        return f'<span class="note">whole on all {mesh.size} devices</span>'
    held = blocks(mesh, t.axes)
    counts = pieces(mesh, t.axes)
    if len(counts) < 2:
        counts = (1, *counts)
        held = {(0, *b): d for b, d in held.items()}
    lead, (rows, cols) = counts[:-2], counts[-2:]
    grids = []
    for n, outer in enumerate(itertools.product(*(range(c) for c in lead))):
        if n == MAX_GRIDS:
            grids.append(f'<span class="note">... {math.prod(lead) - MAX_GRIDS} more</span>')
            break
        body = ""
        for r in range(rows):
            cells = []
            for c in range(cols):
                block = (*outer, r, c)
                color = _COLORS[_block_number(block, counts) % len(_COLORS)]
                cells.append(f'<td style="background:{color}">{" ".join(map(str, held.get(block, [])))}</td>')
            body += "<tr>" + "".join(cells) + "</tr>"
        title = f'<div class="note">[{", ".join(map(str, outer))}, :, :]</div>' if lead else ""
        grids.append(f"<div>{title}<table class=\"grid\">{body}</table></div>")
    return f'<div class="grids">{"".join(grids)}</div>'


def _block_number(block: tuple[int, ...], counts: tuple[int, ...]) -> int:
    """The block's row-major number: its color."""
    index = 0
    for b, n in zip(block, counts):
        index = index * n + b
    return index


def _collectives_html(record: StepRecord) -> str:
    if not record.collectives:
        return "<h4>Collectives</h4><div>none: every device computes its part alone</div>"
    rows = "".join(f"<tr><td>{op}</td><td>{len(found)}</td><td>{human_bytes(sum(c.nbytes for c in found))}</td>"
                   f"<td>{html.escape(', '.join(f'{c.name} {c.shape}' for c in found[:6]))}"
                   f"{' ...' if len(found) > 6 else ''}</td></tr>" for op, found in _by_op(record).items())
    return ("<h4>Collectives (optimized HLO, per device)</h4><table><tr><th>op</th><th>count</th><th>bytes</th>"
            f"<th>instructions</th></tr>{rows}</table>")


def _memory_html(record: StepRecord) -> str:
    m = record.memory
    if m is None:
        return f"<h4>Memory per device</h4><div>{html.escape(panels.memory_lines(record)[0])}</div>"
    return f"<h4>Memory per device ({m.devices} devices)</h4>" + panels.memory_table(m, "xlakit-mesh-memory")


def _axes_text(mesh: MeshInfo) -> str:
    return ", ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.shape))


class ShardingView:
    """A step's sharding view; shows itself as text and HTML (`xlakit.sharding_view()`)."""

    def __init__(self, record: StepRecord, large: int = LARGE_BYTES):
        self.record, self.large = record, large

    def __repr__(self) -> str:
        return text(self.record, self.large)

    def _repr_html_(self) -> str:
        return html_view(self.record, self.large)


def sharding_view(step: StepRecord | None = None) -> ShardingView:
    """How the inputs and outputs of `step` (default: the last) are laid out over
    the mesh, per dim and device; its collectives and memory per device. Shows
    itself as text and HTML."""
    return ShardingView(step if step is not None else session.last_step())
