"""The Profile tab of a step view: where a profiled step's device time went (StepRecord.profile).

Time by module as a collapsible tree with bars (as the Cost tab's estimates, here
measured), the user lines that cost most, the slowest ops with their nodes, lines
and HLO, each op's achieved FLOP/s and bytes/s from the estimates and its measured
time, and the step's timeline: trace, lower, compile and execute one after the other,
and the profiled run's device time beside execute.
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
    """The step's phases on one time axis, each starting where the one before ended (the Cache and
    time tab's numbers); the profiled run's device time starts with execute, the run it measures."""
    t = record.timings
    execute = "execute" if t.waited else "dispatch"
    phases = [("trace", t.trace, "#9aa0a6"), ("lower", t.lower, "#a142f4"), ("compile", t.compile, "#f29900"),
              (execute, t.execute, "#1a73e8")]
    starts, at = [], 0.0
    for _, seconds, _ in phases:
        starts.append(at)
        at += seconds
    phases.append(("device", p.device_seconds, "#188038"))
    starts.append(starts[-1])
    end = max(at, starts[-1] + p.device_seconds) or 1.0
    width = 320
    rows = "".join(f'<tr><td>{name}</td><td><svg width="{width}" height="11"><rect width="{width}" height="11" '
                   f'fill="#eee"/><rect x="{width * start / end:.1f}" width="{max(1.0, width * s / end):.1f}" '
                   f'height="11" fill="{color}"/></svg></td><td class="num">{_us(start)}</td>'
                   f'<td class="num">{_us(s)}</td></tr>'
                   for (name, s, color), start in zip(phases, starts))
    return (f'<h5>Timeline of this step (wall clock: each phase starts where the one before ended; "device" is '
            f"the profiled run of the same executable, measured on the device, drawn from {execute}'s start)</h5>"
            '<table class="xlakit-profile-timeline"><tr><th>phase</th><th></th><th>starts at</th><th>takes</th>'
            f"</tr>{rows}</table>")


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
                    f"<td>{html.escape(op.module or ('' if op.nodes else '-'))}</td>"
                    f'<td class="line"{line_title}>{line}</td>'
                    f'<td class="num">{human_flops(op.flops)}</td><td class="num">{human_bytes(round(op.bytes))}</td>'
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
    log scales with a tick and a grid line at each power of ten. Low on the left: few FLOPs per
    byte, bound by memory bandwidth."""
    points = [op for op in p.ops if op.flops > 0 and op.bytes > 0 and op.seconds > 0]
    if len(points) < 2:
        return ""
    xs = [math.log10(op.flops / op.bytes) for op in points]
    ys = [math.log10(op.flops / op.seconds) for op in points]
    # whole decades around the points, so that every point lies inside and each axis has ticks
    x0, x1 = math.floor(min(xs)), max(math.ceil(max(xs)), math.floor(min(xs)) + 1)
    y0, y1 = math.floor(min(ys)), max(math.ceil(max(ys)), math.floor(min(ys)) + 1)
    width, height, left, top, bottom = 400, 220, 92, 8, 58

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * width

    def py(y: float) -> float:
        return top + height - (y - y0) / (y1 - y0) * height

    out = [f'<svg class="xlakit-roofline" width="{left + width + 24}" height="{top + height + bottom}" '
           'font-size="11" font-family="monospace">']
    # a grid line at every power of ten, a label where there is room for it (~48 px across, 16 px up)
    every_x, every_y = math.ceil(48 / (width / (x1 - x0))), math.ceil(16 / (height / (y1 - y0)))
    for k in range(x0, x1 + 1):
        label = (f'<text x="{px(k):.1f}" y="{top + height + 16}" text-anchor="middle">{_decade(k)}</text>'
                 if (k - x0) % every_x == 0 else "")
        out.append(f'<line class="grid" x1="{px(k):.1f}" y1="{top}" x2="{px(k):.1f}" y2="{top + height + 4}" '
                   f'stroke="#e0e0e0"/>{label}')
    for k in range(y0, y1 + 1):
        label = (f'<text x="{left - 6}" y="{py(k) + 4:.1f}" text-anchor="end">{_rate(10.0 ** k, 1, "FLOP/s")}</text>'
                 if (k - y0) % every_y == 0 else "")
        out.append(f'<line class="grid" x1="{left - 4}" y1="{py(k):.1f}" x2="{left + width}" y2="{py(k):.1f}" '
                   f'stroke="#e0e0e0"/>{label}')
    out.append(f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>'
               f'<text x="{left + width / 2}" y="{top + height + 32}" text-anchor="middle">FLOPs per byte moved</text>')
    for op, x, y in zip(points, xs, ys):
        color = dict(_KIND_COLORS)[_kind(op.module)]
        title = (f"{op.hlo_op} [{op.module or 'top level'}]: {_us(op.seconds)}, {op.flops / op.bytes:.2f} FLOP/B, "
                 f"{_rate(op.flops, op.seconds, 'FLOP/s')}")
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}" fill-opacity="0.7">'
                   f"<title>{html.escape(title)}</title></circle>")
    out.extend(f'<rect x="{left + 100 * i}" y="{top + height + 42}" width="9" height="9" fill="{color}"/>'
               f'<text x="{left + 100 * i + 13}" y="{top + height + 51}">{kind}</text>'
               for i, (kind, color) in enumerate(_KIND_COLORS))
    out.append("</svg>")
    cpu = ("<div>On a CPU, XLA runs matmuls and convolutions asynchronously on its thread pool: such an op's "
           "time is its event and the idle time while its work was in flight; where another op ran beside it, "
           "that op's time holds part of it.</div>" if p.platform == "cpu" else "")
    return ("<h5>Measured against estimated: each op's FLOPs per byte and achieved FLOP/s (log scales)</h5>"
            "<div>An op's FLOPs are xlakit's estimate, its bytes its operands' and result's in the optimized HLO. "
            "Ops on the left do few FLOPs per byte they move: memory bandwidth bounds them. JAX reports "
            f"no peak FLOP/s or bandwidth for the device, so no roof is drawn.</div>{cpu}"
            f'<div class="xlakit-scroll">{"".join(out)}</div>')


def _decade(k: int) -> str:
    """10^k as a tick label: 1e-5, 0.01, 0.1, 1, 10, 100, 1e4."""
    return f"{10.0 ** k:g}" if -2 <= k <= 3 else f"1e{k}"


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
