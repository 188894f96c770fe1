"""The Profile tab of a step view: where a profiled step's device time went (StepRecord.profile).

Time by module as a collapsible tree with bars (as the Cost tab's estimates, here
measured), the user lines that cost most, the slowest ops with their nodes, lines
and HLO, each op's achieved FLOP/s and bytes/s from the estimates and its measured
time, and the step's timeline: trace, lower, compile, run, and the device's time.
Static HTML, no scripts: a saved page shows it as the notebook did.
"""
from __future__ import annotations

import dataclasses
import html
import math

from ..analysis.footprint import short_op
from ..core import hlo, sources
from ..core.record import ProfileInfo, StepRecord
from .units import human_bytes, human_flops

TOP_OPS = 15
TOP_LINES = 8
OPEN_LEVELS = 2


def sections(record: StepRecord) -> list[tuple[str, str]]:
    """[("Profile", html)] for a profiled step, else nothing."""
    if record.profile is None:
        return []
    return [("Profile", "<h4>Profile</h4>" + profile_html(record))]


def profile_html(record: StepRecord) -> str:
    p = record.profile
    return "".join([_summary(record, p), _timeline(record, p), _modules(p), _lines(p), _ops(record, p),
                    _roofline(p)])


def _summary(record: StepRecord, p: ProfileInfo) -> str:
    runs = "one run" if p.runs == 1 else f"the median of {p.runs} runs"
    parts = [f"<div>Measured with JAX's profiler on {html.escape(p.platform or 'the device')}: {runs} of this "
             f"step's cached executable after it ran, on copies of its inputs. Device time "
             f"<b>{_us(p.device_seconds)}</b> (first op's start to last op's end), ops' own time "
             f"{_us(p.op_seconds)}; {p.coverage:.0%} of it joined to recorded ops. Profiling cost "
             f"{_us(p.overhead_seconds)} (input copies, the runs, reading the trace).</div>"]
    c = record.cost
    if c is not None and p.device_seconds > 0:
        parts.append(f"<div>Achieved, from XLA's estimates over the measured device time: "
                     f"{_rate(c.flops, p.device_seconds, 'FLOP/s')}, "
                     f"{_rate(c.bytes_accessed, p.device_seconds, 'B/s')} "
                     f"({c.flops / c.bytes_accessed:.2f} FLOPs per byte).</div>" if c.bytes_accessed else "")
    return "".join(parts)


def _timeline(record: StepRecord, p: ProfileInfo) -> str:
    """One bar per phase of the step, on one scale: where its wall time went."""
    t = record.timings
    phases = [("trace", t.trace, "#9aa0a6"), ("lower", t.lower, "#a142f4"), ("compile", t.compile, "#f29900"),
              ("run" if t.waited else "dispatch", t.execute, "#1a73e8"), ("device", p.device_seconds, "#188038")]
    longest = max(s for _, s, _ in phases) or 1.0
    rows = "".join(f'<tr><td>{name}</td><td><svg width="240" height="9"><rect width="240" height="9" fill="#eee"/>'
                   f'<rect width="{240 * s / longest:.1f}" height="9" fill="{color}"/></svg></td>'
                   f'<td class="num">{_us(s)}</td></tr>' for name, s, color in phases)
    return ('<h5>Timeline (this step; "device" is the profiled run on the device)</h5>'
            f'<table class="xlakit-profile-timeline">{rows}</table>')


@dataclasses.dataclass
class _Module:
    path: str
    seconds: float = 0.0
    children: dict = dataclasses.field(default_factory=dict)


def _modules(p: ProfileInfo) -> str:
    root = _Module("")
    for path, seconds in p.by_module.items():
        here = root
        here.seconds += seconds
        parts = [path] if path.startswith("(") else path.split(".")
        for part in parts:
            here = here.children.setdefault(part, _Module(f"{here.path}.{part}" if here.path else part))
            here.seconds += seconds
    tree = "".join(_tree(child, root.seconds, 0) for child in _in_order(root.children))
    return ("<h5>Time by module (measured; backward.&lt;path&gt; differentiates &lt;path&gt;)</h5>"
            f'<div class="xlakit-cost-tree">{tree}</div>')


def _tree(module: _Module, total: float, depth: int) -> str:
    name = module.path.rsplit(".", 1)[-1] if not module.path.startswith("(") else module.path
    label = (f'<span class="name" style="display:inline-block;width:calc(22em - {depth * 14}px)" '
             f'title="{html.escape(module.path)}">{html.escape(name)}</span> '
             f"{_bar(module.seconds, total)} {_us(module.seconds)}")
    if not module.children:
        return f'<div class="leaf">{label}</div>'
    children = "".join(_tree(c, total, depth + 1) for c in _in_order(module.children))
    own = module.seconds - sum(c.seconds for c in module.children.values())
    if own > 1e-12:
        children += f'<div class="leaf">{_us(own)} in its own ops</div>'
    return f"<details{' open' if depth < OPEN_LEVELS else ''}><summary>{label}</summary>{children}</details>"


def _in_order(children: dict) -> list[_Module]:
    if all(name.isdigit() for name in children):
        return [children[name] for name in sorted(children, key=int)]
    return sorted(children.values(), key=lambda m: -m.seconds)


def _lines(p: ProfileInfo) -> str:
    if not p.by_line:
        return ""
    rows = "".join(f"<tr><td>{html.escape(line)}</td><td>{_bar(s, p.op_seconds)}</td><td class=\"num\">{_us(s)}"
                   f"</td></tr>" for line, s in list(p.by_line.items())[:TOP_LINES])
    return f'<h5>Time by line (measured)</h5><table class="xlakit-profile-lines">{rows}</table>'


def _ops(record: StepRecord, p: ProfileInfo) -> str:
    hlo_lines = _hlo_lines(record.hlo)
    head = ("<tr><th>HLO op</th><th>time</th><th>share</th><th>nodes</th><th>module</th><th>line</th>"
            "<th>FLOPs (est.)</th><th>bytes</th><th>FLOP/s</th><th>B/s</th></tr>")
    rows = []
    for op in p.ops[:TOP_OPS]:
        if op.nodes:
            names = sorted({short_op(record.graph.nodes[n].op) for n in op.nodes})
            made = html.escape(", ".join(names[:4]) + (f", +{len(names) - 4}" if len(names) > 4 else ""))
            made += f" ({len(op.nodes)} nodes, time split by estimated FLOPs)" if op.split else ""
        else:
            made = f"<i>XLA's own: {html.escape(op.xla_own)}</i>"
        # as the graph names lines: "cell 4 line 3", the library's "modeling_llama.py:468 in forward" on hovering
        line = html.escape(sources.short(op.source.user)) if op.source is not None else ""
        library = op.source.library if op.source is not None else None
        line_title = (f' title="{html.escape(sources.short(library))} in {html.escape(library.function)}"'
                      if library is not None else "")
        hlo = html.escape(hlo_lines.get(op.hlo_op, op.hlo_op))
        rows.append(f'<tr><td title="{hlo}">{html.escape(op.hlo_op)}</td><td class="num">{_us(op.seconds)}</td>'
                    f"<td>{op.seconds / p.op_seconds:.0%}</td><td>{made}</td>"
                    f"<td>{html.escape(op.module or ('' if op.nodes else '-'))}</td><td{line_title}>{line}</td>"
                    f"<td>{human_flops(op.flops)}</td><td>{human_bytes(round(op.bytes))}</td>"
                    f'<td class="num">{_rate(op.flops, op.seconds, "FLOP/s")}</td>'
                    f'<td class="num">{_rate(op.bytes, op.seconds, "B/s")}</td></tr>')
    rest = f"<div>and {len(p.ops) - TOP_OPS} faster ops</div>" if len(p.ops) > TOP_OPS else ""
    return (f"<h5>Slowest ops (measured; an op's HLO shows on hovering its name)</h5>"
            f'<table class="xlakit-profile-ops">{head}{"".join(rows)}</table>{rest}')


# where an op's module puts its point in the roofline picture
_KIND_COLORS = (("backward", "#f29900"), ("optimizer", "#a142f4"), ("forward", "#1a73e8"))


def _kind(module: str) -> str:
    return "backward" if module.startswith("backward") else "optimizer" if module.startswith("optimizer") \
        else "forward"


def _roofline(p: ProfileInfo) -> str:
    """Each op with FLOPs as a point: FLOPs per byte (x) against achieved FLOP/s (y), both on
    log scales. Low on the left: few FLOPs per byte, bound by memory bandwidth."""
    points = [op for op in p.ops if op.flops > 0 and op.bytes > 0 and op.seconds > 0]
    if len(points) < 2:
        return ""
    xs = [math.log10(op.flops / op.bytes) for op in points]
    ys = [math.log10(op.flops / op.seconds) for op in points]
    x0, x1, y0, y1 = min(xs), max(xs) + 1e-9, min(ys), max(ys) + 1e-9
    width, height, left, bottom = 360, 200, 60, 24
    out = [f'<svg class="xlakit-roofline" width="{width + left + 10}" height="{height + bottom + 10}" '
           'font-size="9" font-family="monospace">',
           f'<rect x="{left}" y="0" width="{width}" height="{height}" fill="none" stroke="#ccc"/>',
           f'<text x="2" y="9">{_rate(10 ** y1, 1, "FLOP/s")}</text>',
           f'<text x="2" y="{height}">{_rate(10 ** y0, 1, "FLOP/s")}</text>',
           f'<text x="{left}" y="{height + 12}">{10 ** x0:.2g} FLOP/B</text>',
           f'<text x="{left + width - 60}" y="{height + 12}">{10 ** x1:.2g} FLOP/B</text>']
    for op, x, y in zip(points, xs, ys):
        cx = left + (x - x0) / (x1 - x0) * (width - 8) + 4
        cy = height - (y - y0) / (y1 - y0) * (height - 8) - 4
        color = dict(_KIND_COLORS)[_kind(op.module)]
        title = (f"{op.hlo_op} [{op.module or 'top level'}]: {_us(op.seconds)}, {op.flops / op.bytes:.2f} FLOP/B, "
                 f"{_rate(op.flops, op.seconds, 'FLOP/s')}")
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{color}" fill-opacity="0.7">'
                   f"<title>{html.escape(title)}</title></circle>")
    legend = "".join(f'<rect x="{left + 90 * i}" y="{height + 17}" width="8" height="8" fill="{color}"/>'
                     f'<text x="{left + 90 * i + 11}" y="{height + 25}">{kind}</text>'
                     for i, (kind, color) in enumerate(_KIND_COLORS))
    out.append(legend + "</svg>")
    return ("<h5>Measured against estimated: each op's FLOPs per byte and achieved FLOP/s (log scales)</h5>"
            "<div>Ops on the left do few FLOPs per byte they move: memory bandwidth bounds them. JAX reports "
            "no peak FLOP/s or bandwidth for the device, so no roof is drawn.</div>" + "".join(out))


def _hlo_lines(text: str | None) -> dict[str, str]:
    """Each instruction's line of the optimized HLO, its metadata left out."""
    return {i.name: f"{'ROOT ' if i.root else ''}%{i.name} = {i.definition}"
            for i in hlo.parse(text).instructions.values()}


def _bar(part: float, total: float) -> str:
    share = part / total if total else 0.0
    return (f'<svg width="60" height="9"><rect width="60" height="9" fill="#eee"/>'
            f'<rect width="{60 * share:.1f}" height="9" fill="#188038"/></svg> {share:>4.0%}')


def _us(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"


def _rate(amount: float, seconds: float, unit: str) -> str:
    if seconds <= 0 or not amount:
        return "-"
    rate = amount / seconds
    for prefix in ("", "k", "M", "G", "T"):
        if rate < 1000 or prefix == "T":
            return f"{rate:.1f} {prefix}{unit}"
        rate /= 1000
    return f"{rate:.1f} P{unit}"
