"""StepRecord -> plain text and static HTML. Views read records; they never reach into the engine.

The plain text is deterministic (no timings, no addresses) so nbval and
terminals see something true; timings appear only in the HTML.
"""
from __future__ import annotations

import html

from ..analysis import misses
from ..core import record as record_text
from ..core.record import Backend, Cache, StepRecord, Timings, cache_line, donation_lines, human_bytes, key_owner
from . import graph_dot, panels, sharding_view

# left-aligned cells `!important`: nbconvert's pages carry JupyterLab's right-aligned ones, more specific
STYLE = """<style>
.xlakit-step table{border-collapse:collapse;font-family:monospace;font-size:12px;margin:4px 0}
.xlakit-step td,.xlakit-step th{border:1px solid #ddd;padding:2px 6px;text-align:left !important}
.xlakit-step .changed{background:#fff3cd}.xlakit-step .not-in-key{color:#777}
.xlakit-step h4{margin:8px 0 2px 0}.xlakit-step .graph{overflow:auto;max-height:480px;border:1px solid #eee}
.xlakit-step .xlakit-warning{background:#fce8e6;border:1px solid #d93025;padding:4px 8px;margin:4px 0}
.xlakit-step .xlakit-cost-tree{font-family:monospace;font-size:12px}.xlakit-step td.num{white-space:nowrap}
.xlakit-step .xlakit-cost-tree details,.xlakit-step .xlakit-cost-tree .leaf{margin-left:14px}
.xlakit-step .xlakit-cost-tree .leaf{padding-left:14px}
</style>"""


def changed_components(record: StepRecord, previous: StepRecord | None) -> set[str]:
    if previous is None:
        return set()
    changed = {c for c, v in record.components.items() if previous.components.get(c) != v}
    if record.metadata_digest != previous.metadata_digest:
        changed.add("metadata")
    return changed


def why_lines(record: StepRecord, previous: StepRecord | None = None) -> list[str]:
    """On a miss with a previous step of the same cell: what differs from that
    step (what the user changed), from the two records' data. The engine's own
    `why` answers another question, the difference from the closest cached key,
    which may be another cell's graph; it is shown when there is no previous step."""
    if (record.cache is not Cache.HIT and record.backend is Backend.XLAKIT
            and previous is not None and previous.key != record.key):
        changed = misses.diff(record.components, previous.components)
        return [f"differs from this cell's previous step (#{previous.index}) in: {', '.join(changed)}",
                *misses.explain_miss(record.components, record.graph, previous.components, previous.graph)]
    return record_text.why_lines(record)


def text(record: StepRecord, name: str | None = None, previous: StepRecord | None = None) -> str:
    return record_text.text(record, name, changed_components(record, previous), why_lines(record, previous))


def html_view(record: StepRecord, name: str | None = None, previous: StepRecord | None = None,
              hlo: bool = False) -> str:
    return "".join([STYLE, '<div class="xlakit-step">', _header_html(record, name),
                    *(section for _, section in sections_html(record, previous, hlo)), "</div>"])


def sections_html(record: StepRecord, previous: StepRecord | None, hlo: bool) -> list[tuple[str, str]]:
    """(title, html) per view section; the widget puts each in a tab."""
    sections = [
        ("Graph", f'<h4>Graph</h4><div class="graph">{graph_dot.step_svg(record, previous)}</div>'),
        ("Key", "<h4>Key</h4>" + key_table(record, previous)),
        ("Why", "<h4>Why</h4>" + _list_html(why_lines(record, previous))),
        ("Donation", "<h4>Donation</h4>" + donation_table(record)),
        ("Cache and time", "<h4>Cache and time</h4>" + timing_table(record)),
        ("Memory", "<h4>Memory</h4>" + panels.memory_html(record)),
        ("Cost", "<h4>Cost</h4>" + panels.cost_html(record)),
        *sharding_view.sections(record),
    ]
    if hlo:
        sections.append(("HLO", f"<h4>HLO</h4><pre>{html.escape(record.hlo or 'unknown')}</pre>"))
    return sections


def key_table(record: StepRecord, previous: StepRecord | None) -> str:
    changed = changed_components(record, previous)
    rows = [(c, v, key_owner(record)) for c, v in record.components.items()]
    rows.append(("metadata", record.metadata_digest or "unknown", "not in key"))
    body = "".join(
        f'<tr class="{"changed" if c in changed else ""} {"not-in-key" if where == "not in key" else ""}">'
        f"<td>{c}</td><td>{v}</td><td>{where}{' (changed)' if c in changed else ''}</td></tr>"
        for c, v, where in rows)
    return f'<table class="xlakit-key"><tr><th>component</th><th>digest</th><th></th></tr>{body}</table>' \
           f"<div>key {record.key}</div>"


def donation_table(record: StepRecord) -> str:
    if not record.donated:
        return _list_html(donation_lines(record))
    body = "".join(f"<tr><td>{_known(d.index)}</td><td>{html.escape(d.label or '(unlabelled)')}</td>"
                   f"<td>{_known(d.shape and list(d.shape))}</td><td>{_known(d.dtype)}</td>"
                   f"<td>{human_bytes(d.nbytes)}</td></tr>" for d in record.donated)
    label = "not donated" if record.backend is Backend.XLAKIT else "note"
    note = f"<div>{label}: {html.escape(record.donation_note)}</div>" if record.donation_note else ""
    return (f'<table class="xlakit-donation"><tr><th>input</th><th>label</th><th>shape</th><th>dtype</th>'
            f"<th>bytes</th></tr>{body}</table><div>total {human_bytes(record.donated_bytes)} reused</div>{note}")


def timing_table(record: StepRecord) -> str:
    t = record.timings
    rows = [("cache", cache_line(record)), ("trace", _ms(t.trace)), ("lower", _ms(t.lower)),
            ("compile", _ms(t.compile)), ("execute", _execute_ms(t)),
            ("executables cached", _known(record.cache_entries)),
            ("hit rate so far", _known(record.hit_rate, "{:.0%}"))]
    return '<table class="xlakit-timing">' + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) \
        + "</table>"


def _header_html(record: StepRecord, name: str | None) -> str:
    title = f"step {record.index}" + (f" [{html.escape(name)}]" if name else "")
    where = f" at {html.escape(record.source)}" if record.source else ""
    return (f"<div><b>{title}</b>: {record.trigger}, {cache_line(record)}, {record.num_nodes} nodes, "
            f"{record.num_inputs} inputs, {record.num_outputs} outputs{where}</div>")


def _known(value, form: str = "{}") -> str:
    return "unknown" if value is None else form.format(value)


def _list_html(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _execute_ms(t: Timings) -> str:
    return _ms(t.execute) if t.waited else f"{_ms(t.execute)} to dispatch (not waited for)"


def history_text(rows: list[tuple[str, StepRecord]]) -> str:
    lines = [f"{'#':>4} {'cell/name':<16} {'trigger':<10} {'key':<12} {'cache':<15} {'donated':>10} "
             f"{'peak memory':>11}"]
    for name, r in rows:
        lines.append(f"{r.index:>4} {name[:16]:<16} {r.trigger:<10} {r.key[:12]:<12} {r.cache:<15} "
                     f"{human_bytes(r.donated_bytes):>10} {_peak(r):>11}")
    return "\n".join(lines)


def history_html(rows: list[tuple[str, StepRecord]]) -> str:
    body = "".join(
        f"<tr><td>{r.index}</td><td>{html.escape(name)}</td><td>{r.trigger}</td><td>{r.key[:12]}</td>"
        f"<td>{r.cache}</td><td>{_ms(r.timings.compile)}</td><td>{_execute_ms(r.timings)}</td>"
        f"<td>{human_bytes(r.donated_bytes)}</td><td>{_peak(r)}</td></tr>" for name, r in rows)
    table = (f'<table class="xlakit-history"><tr><th>#</th><th>cell/name</th><th>trigger</th><th>key</th>'
             f"<th>cache</th><th>compile</th><th>execute</th><th>donated</th><th>peak memory</th></tr>"
             f"{body}</table>")
    return STYLE + f'<div class="xlakit-step">{table}{_time_plot(rows)}</div>'


def _peak(record: StepRecord) -> str:
    """Peak memory per device, as XLA's memory analysis says."""
    return human_bytes(record.memory.peak) if record.memory is not None else "unknown"


def _time_plot(rows: list[tuple[str, StepRecord]]) -> str:
    """Compile (orange) and execute (blue) ms per step, as bars on a log-free linear scale."""
    if not rows:
        return ""
    peak = max(max(r.timings.compile, r.timings.execute) for _, r in rows) or 1.0
    bar, height = 10, 80
    parts = [f'<svg class="xlakit-history-plot" width="{len(rows) * (2 * bar + 4) + 10}" height="{height + 14}" '
             f'font-size="9" font-family="monospace">']
    for k, (_, r) in enumerate(rows):
        x = 5 + k * (2 * bar + 4)
        for j, (value, color) in enumerate(((r.timings.compile, "#f29900"), (r.timings.execute, "#1a73e8"))):
            h = max(1.0, value / peak * height)
            parts.append(f'<rect x="{x + j * bar}" y="{height - h:.1f}" width="{bar - 1}" height="{h:.1f}" '
                         f'fill="{color}"><title>step {r.index} {"compile" if j == 0 else "execute"} '
                         f'{_ms(value)}</title></rect>')
        parts.append(f'<text x="{x}" y="{height + 11}">{r.index}</text>')
    parts.append("</svg>")
    return "".join(parts)
