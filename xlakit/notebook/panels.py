"""The Memory and Cost panels of a step view: each as plain text and as static HTML (no scripts).

Memory: XLA's memory analysis of the compiled executable (per device, known
before it runs) and the step's largest buffers by name; the sharding view shows
the same text and table. Cost: XLA's cost analysis, and xlakit's own per-op
estimates split by module and by op.
"""
from __future__ import annotations

import html

from ..analysis import flops, footprint
from ..analysis.flops import ModuleCost
from ..core.record import MemoryInfo, StepRecord
from .units import human_bytes, human_flops

OPEN_LEVELS = 3      # module tree levels shown open; deeper ones open on a click
TOP_OPS = 10


def memory_lines(record: StepRecord) -> list[str]:
    """The executable's memory per device in one line (its peak, and what it
    allocates, as a sum), and a second one when the peak exceeds the device's memory."""
    m = record.memory
    if m is None:
        return [f"unknown ({record.backend} gives no memory analysis of this executable)"]
    per = f"on each of {m.devices} devices" if m.devices > 1 else "per device"
    aliased = f" - {human_bytes(m.aliased)} written into donated inputs" if m.aliased else ""
    code = f" + code {human_bytes(m.code)}" if m.code else ""
    lines = [f"peak {human_bytes(m.peak)} {per} (buffers live at once, XLA's count); allocated "
             f"{human_bytes(m.allocated)} = arguments {human_bytes(m.arguments)} + outputs {human_bytes(m.outputs)}"
             f"{aliased} + temporaries {human_bytes(m.temporaries)}{code}"]
    if m.over_limit:
        lines.append(f"the peak is more than the device's {human_bytes(m.device_limit)}: "
                     "this step will likely run out of memory")
    return lines


def memory_html(record: StepRecord) -> str:
    m = record.memory
    parts = []
    if m is None:
        parts.append(f"<div>{html.escape(memory_lines(record)[0])}</div>")
    else:
        if m.over_limit:
            parts.append(f'<div class="xlakit-warning">&#9888; This step needs {human_bytes(m.peak)} per device at '
                         f"its peak, more than the device's {human_bytes(m.device_limit)}: it will likely run out "
                         "of memory. Use smaller batches, donation, or shard it.</div>")
        each = f"each of {m.devices} devices" if m.devices > 1 else "the device"
        parts.append(f"<div>What {each} holds while the step runs, from XLA's memory analysis of the compiled "
                     "executable (known before it runs):</div>" + memory_table(m, "xlakit-memory") + _memory_bars(m))
    parts.append(_buffers_table(record))
    return "".join(parts)


def memory_table(m: MemoryInfo, css_class: str) -> str:
    """What each device holds, with what each line means; on a mesh, also summed over its devices.
    `css_class` tells the step view's table from the sharding view's."""
    rows = [("arguments", m.arguments, "the step's inputs: parameters, optimizer state, data, scalars"),
            ("+ outputs", m.outputs, "the values it computes"),
            ("- into donated inputs", m.aliased,
             "outputs written into donated inputs' buffers: counted in both above, held once"),
            ("+ temporaries", m.temporaries, "XLA's scratch space for intermediates (activations, ...)"),
            ("= allocated", m.allocated, "every buffer of the executable, each held once: the safe bound"),
            ("peak", m.peak, "XLA's count of the most held at once (its schedule frees buffers early; on a "
                             "CPU it has left the temporaries out)"),
            ("device memory", m.device_limit, "what the device has" if m.device_limit is not None
             else "not reported by the device's runtime (a CPU's is not)")]
    if m.code:
        rows.insert(4, ("+ generated code", m.code, "the executable's code, held on the device"))
    mesh = m.devices > 1
    head = f"<tr><th></th><th>per device</th><th>all {m.devices} devices</th><th></th></tr>" if mesh else ""
    body = "".join(f'<tr><td>{name}</td><td class="num">{human_bytes(n)}</td>'
                   + (f'<td class="num">{human_bytes(None if n is None else n * m.devices)}</td>' if mesh else "")
                   + f"<td>{html.escape(what)}</td></tr>" for name, n, what in rows)
    return f'<table class="{css_class}">{head}{body}</table>'


def _memory_bars(m) -> str:
    """Bars of arguments, outputs, temporaries, allocated and peak; the device's memory as a red line."""
    bars = [("arguments", m.arguments, "#8ab4f8"), ("outputs", m.outputs, "#81c995"),
            ("temporaries", m.temporaries, "#fdd663"), ("allocated", m.allocated, "#9aa0a6"),
            ("peak", m.peak, "#5f6368")]
    scale = max([n for _, n, _ in bars] + [m.device_limit or 0]) or 1
    width, left, row = 320, 90, 16
    out = [f'<svg class="xlakit-memory-bars" width="{left + width + 90}" height="{row * len(bars) + 6}" '
           'font-family="monospace" font-size="11">']
    for k, (name, n, color) in enumerate(bars):
        w = max(1.0, n / scale * width)
        out.append(f'<text x="0" y="{k * row + 12}">{name}</text><rect x="{left}" y="{k * row + 2}" '
                   f'width="{w:.1f}" height="{row - 4}" fill="{color}"/>'
                   f'<text x="{left + w + 4:.1f}" y="{k * row + 12}">{human_bytes(n)}</text>')
    if m.device_limit:
        x = left + m.device_limit / scale * width
        out.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{row * len(bars) + 6}" stroke="#d93025" '
                   f'stroke-dasharray="4 2"><title>device memory {human_bytes(m.device_limit)}</title></line>')
    out.append("</svg>")
    return "".join(out)


def _buffers_table(record: StepRecord) -> str:
    largest = footprint.largest(record)
    if not largest:
        return ""
    scope = " (whole tensors; each device holds its shard)" if record.memory and record.memory.devices > 1 else ""
    body = "".join(f"<tr><td>{b.kind} {b.index}</td><td>{html.escape(b.label)}</td>"
                   f"<td>{html.escape(b.aval or 'unknown')}</td><td class='num'>{human_bytes(b.nbytes)}</td>"
                   f"<td>{html.escape(b.note)}</td></tr>" for b in largest)
    roles = "".join(f'<tr><td>{role}</td><td>{count}</td><td class="num">{human_bytes(n)}</td></tr>'
                    for role, count, n in footprint.by_role(record))
    return (f"<h5>Inputs and outputs{scope}</h5>"
            f'<table class="xlakit-roles"><tr><th></th><th>buffers</th><th>bytes</th></tr>{roles}</table>'
            "<h5>The largest</h5>"
            '<table class="xlakit-buffers"><tr><th>buffer</th><th>name, or the op that made or reads it</th>'
            '<th>aval</th>'
            f"<th>bytes</th><th>donation</th></tr>{body}</table>")


def cost_line(record: StepRecord) -> str:
    c = record.cost
    if c is None:
        return (f"no XLA estimate ({record.backend} gives no cost analysis of this executable); "
                f"xlakit's own estimate {human_flops(flops.by_module(record.graph).flops)} (Cost tab)")
    return (f"{human_flops(c.flops)}, {human_bytes(round(c.bytes_accessed))} accessed per device "
            "(XLA's estimates)")


def cost_html(record: StepRecord) -> str:
    c = record.cost
    if c is None:
        parts = [f"<div>unknown ({html.escape(str(record.backend))} gives no cost analysis of this executable)</div>"]
    else:
        intensity = f"{c.flops / c.bytes_accessed:.2f}" if c.bytes_accessed else "unknown"
        rows = [("FLOPs", human_flops(c.flops)), ("bytes accessed", human_bytes(round(c.bytes_accessed))),
                ("transcendentals", f"{c.transcendentals:.0f}"), ("FLOPs per byte accessed", intensity)]
        each = " per device" if record.memory is None or record.memory.devices == 1 else \
            f" per device (each of {record.memory.devices})"
        parts = [f"<div>XLA's cost analysis of the compiled executable: <b>estimates</b>{each}.</div>"
                 '<table class="xlakit-cost">'
                 + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) + "</table>"]
    tree = flops.by_module(record.graph)
    parts.append(f"<div>xlakit's own estimate from each op and its shapes ({html.escape(_RULES)}): "
                 f"{human_flops(tree.flops)}{_versus(tree.flops, record)}.</div>")
    if tree.children:
        parts.append("<h5>By module (estimates; backward ops count toward the module they differentiate)</h5>"
                     f'<div class="xlakit-cost-tree">{_tree_html(tree, tree.flops, 0)}</div>')
    else:
        parts.append("<div>No op of this step names a module, so there is no split by module.</div>")
    parts.append(_ops_table(record, tree.flops))
    return "".join(parts)


_RULES = ("matmuls, convolutions and attention by torch.utils.flop_counter's formulas (2·m·n·k), "
          "reductions 1 per input element, data movement 0, other ops 1 per output element")


def _versus(estimate: float, record: StepRecord) -> str:
    """The estimate (the whole program's ops, once) against XLA's count of the same scope:
    XLA counts what one device runs, so on N devices its count times N."""
    cost = record.cost
    if cost is None or not cost.flops:
        return ""
    why = "XLA counts the fused, simplified program, and some ops its own way"
    if record.numerics is not None and record.numerics.ranges is not None:
        # a 64-64-8 MLP's forward: 99% of XLA's count, 66% with record_ranges (+148 kFLOP of checks)
        why += ("; here XLA's count also holds the ranges check's ops (config.record_ranges, --ranges: "
                "each module's largest value), which this estimate leaves out")
    devices = record.memory.devices if record.memory else 1
    if devices == 1:
        return f", {estimate / cost.flops:.0%} of XLA's count ({why})"
    whole = cost.flops * devices
    return (f", {estimate / whole:.0%} of XLA's count for the whole program: {human_flops(cost.flops)} per "
            f"device x {devices} devices = {human_flops(whole)} ({why}; work replicated on several devices "
            "counts once per device there, once here)")


def _tree_html(cost: ModuleCost, total: float, depth: int) -> str:
    # names in a column as wide at every depth, so the bars line up
    label = (f'<span class="name" style="display:inline-block;width:calc(20em - {depth * 14}px)" '
             f'title="{html.escape(cost.path)}">{html.escape(cost.name)}</span> '
             f"{_share_bar(cost.flops, total)} {human_flops(cost.flops)}"
             + (f" ({human_flops(cost.backward)} backward)" if cost.backward else "")
             + f", {_ops(cost.ops)}")
    if not cost.children:
        return f'<div class="leaf">{label}</div>'
    own = cost.ops - sum(c.ops for c in cost.children.values())
    children = "".join(_tree_html(c, total, depth + 1) for c in _in_order(cost.children))
    if own:
        children += f'<div class="leaf">{_ops(own)} of its own</div>'
    return (f"<details{' open' if depth < OPEN_LEVELS else ''}><summary>{label}</summary>"
            f"{children}</details>")


def _in_order(children: dict[str, ModuleCost]) -> list[ModuleCost]:
    """A list's items (layers.0, layers.1, ...) in their order; other modules most FLOPs first."""
    if all(name.isdigit() for name in children):
        return [children[name] for name in sorted(children, key=int)]
    return sorted(children.values(), key=lambda c: -c.flops)


def _ops(n: int) -> str:
    return f"{n} op" if n == 1 else f"{n} ops"


def _share_bar(part: float, total: float) -> str:
    share = part / total if total else 0.0
    return (f'<svg width="60" height="9"><rect width="60" height="9" fill="#eee"/>'
            f'<rect width="{60 * share:.1f}" height="9" fill="#1a73e8"/></svg> {share:>4.0%}')


def _ops_table(record: StepRecord, total: float) -> str:
    rows = flops.by_op(record.graph)
    shown = rows[:TOP_OPS]
    body = "".join(f"<tr><td>{html.escape(op)}</td><td>{count}</td><td>{human_flops(est)}</td>"
                   f"<td>{f'{est / total:.0%}' if total else ''}</td></tr>" for op, count, est in shown)
    rest = f"<div>and {len(rows) - len(shown)} ops with fewer FLOPs</div>" if len(rows) > len(shown) else ""
    return ("<h5>By op (estimates)</h5><table class=\"xlakit-ops\"><tr><th>op</th><th>nodes</th>"
            f"<th>FLOPs</th><th>share</th></tr>{body}</table>{rest}")
