"""The history as a picture: per step, its wall time split into Python (trace and
lowering), compile and execute, a dot under each step that compiled (a ring under one
that loaded its executable from the disk cache: its "compile" bar is the load), and
the peak memory as a line. Inline SVG, so a static page shows it as the notebook did.
`%xla_history --plot` draws the %%xla_step steps, `xlakit.history()` every kept step.
"""
from __future__ import annotations

import html

from .. import session
from ..core.record import Cache, StepRecord
from .units import human_bytes

# bars as wide as the plot's ~640 px allow, 12-40 px each; 11 px text (9 px and 12 px bars filled a
# third of a notebook's width for 10 steps)
WIDE, BARS, GAP, HEIGHT, FONT = 640, (12, 40), 3, 160, 11
# the parts of a step's wall time, bottom up
PARTS = (("Python (trace + lower)", "#9aa0a6"), ("compile", "#f29900"), ("execute", "#1a73e8"))
MEMORY_COLOR = "#a142f4"
COMPILE_MARK = "#d93025"
# the marks under the bars as the legend draws them
MARKS = (("compiled (dot)", f'fill="{COMPILE_MARK}"'),
         ("loaded from the disk cache (ring)", f'fill="none" stroke="{COMPILE_MARK}" stroke-width="1.5"'))


def _parts(record: StepRecord) -> tuple[float, float, float]:
    t = record.timings
    return t.trace + t.lower, t.compile, t.execute


def svg(rows: list[tuple[str, StepRecord]]) -> str:
    """The plot of `rows` ((name, record) per step, oldest first)."""
    if not rows:
        return "<div>No steps yet.</div>"
    bar = int(min(max(WIDE / len(rows) - GAP, BARS[0]), BARS[1]))
    tallest = max(sum(_parts(r)) for _, r in rows) or 1.0
    peaks = [r.memory.peak if r.memory is not None else None for _, r in rows]
    most = max((p for p in peaks if p is not None), default=0) or 1
    left, top = 70, 16
    width = left + len(rows) * (bar + GAP) + 80
    out = [f'<svg class="xlakit-history-steps" width="{width}" height="{top + HEIGHT + 66}" font-size="{FONT}" '
           'font-family="monospace">',
           f'<text x="2" y="{top - 4}">{tallest * 1e3:.1f} ms</text>',
           f'<line x1="{left - 2}" y1="{top}" x2="{left - 2}" y2="{top + HEIGHT}" stroke="#999"/>',
           f'<text x="{width - 78}" y="{top - 4}" fill="{MEMORY_COLOR}">{human_bytes(most)}</text>']
    memory_points = []
    for k, (name, r) in enumerate(rows):
        x = left + k * (bar + GAP)
        y = top + HEIGHT
        times = _parts(r)
        for (label, color), seconds in zip(PARTS, times):
            h = seconds / tallest * HEIGHT
            y -= h
            out.append(f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{h:.1f}" fill="{color}">'
                       f"<title>{html.escape(_tooltip(name, r, label, seconds))}</title></rect>")
        if r.cache == Cache.MISS:
            why = "; ".join(r.why) or "first compile of this graph"
            out.append(f'<circle class="compile" cx="{x + bar / 2}" cy="{top + HEIGHT + 9}" r="4" '
                       f'fill="{COMPILE_MARK}"><title>{html.escape(f"step {r.index} compiled: {why}")}</title>'
                       "</circle>")
        elif r.cache == Cache.PERSISTENT_HIT:
            out.append(f'<circle class="loaded" cx="{x + bar / 2}" cy="{top + HEIGHT + 9}" r="3.5" fill="none" '
                       f'stroke="{COMPILE_MARK}" stroke-width="1.5"><title>step {r.index} loaded its executable from '
                       "the disk cache (not compiled)</title></circle>")
        if peaks[k] is not None:
            memory_points.append(f"{x + bar / 2:.1f},{top + HEIGHT - peaks[k] / most * HEIGHT:.1f}")
        if k % max(1, len(rows) // 20) == 0:
            out.append(f'<text x="{x}" y="{top + HEIGHT + 26}">{r.index}</text>')
    if memory_points:
        out.append(f'<polyline points="{" ".join(memory_points)}" fill="none" stroke="{MEMORY_COLOR}" '
                   'stroke-width="1.5"><title>peak memory per device</title></polyline>')
    # the legend in two rows: the bars' parts and the memory line, then the marks under the bars
    right = width
    for row, entries in enumerate(([(label, f'fill="{color}"') for label, color in PARTS]
                                   + [("peak memory", f'fill="{MEMORY_COLOR}"')], MARKS)):
        x, legend_y = left, top + HEIGHT + 44 + 16 * row
        for label, paint in entries:
            mark = (f'<circle cx="{x + 4.5}" cy="{legend_y - 3.5}" r="3.5" {paint}/>' if row
                    else f'<rect x="{x}" y="{legend_y - 8}" width="9" height="9" {paint}/>')
            out.append(f'{mark}<text x="{x + 12}" y="{legend_y}">{html.escape(label)}</text>')
            x += 12 + 7 * len(label) + 10  # 11 px monospace: ~6.6 px a character
        right = max(right, x)
    out.append("</svg>")
    out[0] = out[0].replace(f'width="{width}"', f'width="{right}"')
    return "".join(out)


def _tooltip(name: str, r: StepRecord, part: str, seconds: float) -> str:
    return f"step {r.index} ({name}, {r.cache}): {part} {seconds * 1e3:.2f} ms"


def text(rows: list[tuple[str, StepRecord]]) -> str:
    """The same, in words: the totals and the steps that compiled."""
    if not rows:
        return "No steps yet."
    python, compile_, execute = (sum(_parts(r)[i] for _, r in rows) for i in range(3))
    compiled = [r.index for _, r in rows if r.cache == Cache.MISS]
    return (f"{len(rows)} steps: Python {python:.2f} s, compile {compile_:.2f} s, execute {execute:.2f} s; "
            f"{len(compiled)} compiled" + (f" (steps {', '.join(map(str, compiled))})" if compiled else ""))


class HistoryPlot:
    """A displayable history plot: the SVG in HTML, the totals in plain text."""

    def __init__(self, rows: list[tuple[str, StepRecord]]):
        self.rows = list(rows)

    def __repr__(self) -> str:
        return text(self.rows)

    def _repr_html_(self) -> str:
        return f'<div class="xlakit-history-picture" style="overflow-x:auto;max-width:100%">{svg(self.rows)}</div>'


def history() -> HistoryPlot:
    """Every kept step (xlakit.steps()) as a picture: wall time split into Python, compile and
    execute, the steps that compiled, and the peak memory; displays as inline SVG."""
    return HistoryPlot([(r.source or str(r.trigger), r) for r in session.steps()])
