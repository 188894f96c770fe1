"""StepRecord -> plain text and static HTML: the step view (its summary, key, why,
donation, cache and time panels here, each as text and HTML; memory and cost in
panels.py, the measured profile in profile_view.py, sharding in sharding_view.py) and the history. Views read records;
they never reach into the engine.

The plain text is deterministic (no timings, no addresses) so nbval and
terminals see something true; timings appear only in the HTML. It is also how a
StepRecord prints (xlakit/__init__ binds `text` as its repr).
"""
from __future__ import annotations

import html

from ..analysis import misses
from ..core.record import Backend, Cache, StepRecord, Timings
from . import graph_dot, numerics_view, panels, profile_view, sharding_view
from .units import human_bytes

# left-aligned cells `!important`: nbconvert's pages carry JupyterLab's right-aligned ones, more specific.
# A table or picture wider than its tab scrolls in its own box (as a block, as wide as its content up to
# the tab's width): a Profile tab's ops table was 1099-1145 px in a 928-1102 px tab, and the tab's only
# scrollbar was at the bottom of the 3333 px tab, its sentences cut at the right.
STYLE = """<style>
.xlakit-step table{border-collapse:collapse;font-family:monospace;font-size:12px;margin:4px 0;display:block;
overflow-x:auto;max-width:100%;width:fit-content}.xlakit-step .xlakit-scroll{overflow-x:auto;max-width:100%}
.xlakit-step td.line{white-space:nowrap}.xlakit-step h5{font-size:13px;margin:8px 0 2px 0}
.xlakit-step td,.xlakit-step th{border:1px solid #ddd;padding:2px 6px;text-align:left !important}
.xlakit-step .changed{background:#fff3cd}.xlakit-step .not-in-key{color:#777}
.xlakit-step h4{margin:8px 0 2px 0}.xlakit-step .graph{overflow:auto;max-height:480px;border:1px solid #eee}
.xlakit-step .xlakit-graph-groups details details{margin-left:14px}
.xlakit-step .xlakit-warning{background:#fce8e6;border:1px solid #d93025;padding:4px 8px;margin:4px 0}
.xlakit-step .xlakit-cost-tree{font-family:monospace;font-size:12px}.xlakit-step td.num{white-space:nowrap}
.xlakit-step .xlakit-cost-tree details,.xlakit-step .xlakit-cost-tree .leaf{margin-left:14px}
.xlakit-step .xlakit-cost-tree .leaf{padding-left:14px}
</style>"""


# -- summary ------------------------------------------------------------------------
def summary_lines(record: StepRecord, name: str | None) -> list[str]:
    title = f"step {record.index}" + (f" [{name}]" if name else "") + \
        ("" if record.backend is Backend.XLAKIT else f" ({record.backend})")
    lines = [f"{title}: trigger={record.trigger} {cache_line(record)} key={record.key[:16]}",
             f"  graph: {record.num_nodes} nodes, {record.num_inputs} inputs, {record.num_outputs} outputs"]
    if record.source:
        lines.append(f"  at {record.source}")
    if record.replay is not None and (record.replay.replayed or record.replay.recorded):
        lines.append(f"  recording: {replay_line(record)}")
    return lines


def replay_line(record: StepRecord) -> str:
    """'2000 ops replayed, 0 traced one by one' and, if it stopped matching, where (engine/tape.py)."""
    replay = record.replay
    line = f"{replay.replayed} ops replayed, {replay.recorded} traced one by one"
    return f"{line}; {replay.why}" if replay.why else line


def _header_html(record: StepRecord, name: str | None) -> str:
    title = f"step {record.index}" + (f" [{html.escape(name)}]" if name else "")
    where = f" at {html.escape(record.source)}" if record.source else ""
    return (f"<div><b>{title}</b>: {record.trigger}, {cache_line(record)}, {record.num_nodes} nodes, "
            f"{record.num_inputs} inputs, {record.num_outputs} outputs{where}</div>")


# -- key ----------------------------------------------------------------------------
def key_lines(record: StepRecord, changed: set[str]) -> list[str]:
    lines = [f"  key components ({_key_owner(record)}):"]
    lines += [f"    {c:<8} {v[:16]}{'  *changed*' if c in changed else ''}" for c, v in record.components.items()]
    lines.append(f"    metadata {(record.metadata_digest or 'unknown')[:16]} (not in key)"
                 f"{'  *changed*' if 'metadata' in changed else ''}")
    return lines


def key_table(record: StepRecord, changed: set[str]) -> str:
    rows = [(c, v, _key_owner(record)) for c, v in record.components.items()]
    rows.append(("metadata", record.metadata_digest or "unknown", "not in key"))
    body = "".join(
        f'<tr class="{"changed" if c in changed else ""} {"not-in-key" if where == "not in key" else ""}">'
        f"<td>{c}</td><td>{v}</td><td>{where}{' (changed)' if c in changed else ''}</td></tr>"
        for c, v, where in rows)
    return f'<table class="xlakit-key"><tr><th>component</th><th>digest</th><th></th></tr>{body}</table>' \
           f"<div>key {record.key}</div>"


def _key_owner(record: StepRecord) -> str:
    return "in key" if record.backend is Backend.XLAKIT else f"in {record.backend}'s key"


# -- why ----------------------------------------------------------------------------
def why_lines(record: StepRecord, previous: StepRecord | None = None) -> list[str]:
    """Why the step hit or missed. On a miss with a previous step of the same cell:
    what differs from that step (what the user changed), from the two records' data.
    Otherwise as its executor said: on a miss, the engine's comparison with the closest
    cached key, which may be another cell's graph."""
    if record.cache is Cache.HIT:
        return [cache_line(record)]
    if record.backend is not Backend.XLAKIT:
        return [cache_line(record), *record.why]
    if previous is not None and previous.key != record.key:
        changed = misses.diff(record.components, previous.components)
        return [f"differs from this cell's previous step (#{previous.index}) in: {', '.join(changed)}",
                *misses.explain_miss(record.components, record.graph, previous.components, previous.graph)]
    if not record.changed:
        return ["first compilation of this graph (nothing similar cached)"]
    return [f"differs from the closest cached key in: {', '.join(record.changed)}", *record.why]


# -- donation -----------------------------------------------------------------------
def donation_lines(record: StepRecord) -> list[str]:
    if not record.donated:
        if record.backend is not Backend.XLAKIT and record.cache is Cache.HIT:
            return [f"unknown: {record.donation_note}"]   # torch_xla says only when it compiles
        return [f"nothing donated{': ' + record.donation_note if record.donation_note else ''}"]
    total = record.donated_bytes
    lines = [f"{len(record.donated)} buffer(s) donated"
             + (f", {human_bytes(total)} reused" if total is not None else "")]
    lines += [f"  input {d.index} {d.label or '(unlabelled)'} {d.dtype}{list(d.shape)} {human_bytes(d.nbytes)}"
              for d in record.donated if d.index is not None]  # torch_xla says how many, not which
    if record.donation_note:
        lines.append(f"  {_not_donated(record)}: {record.donation_note}")
    return lines


def donated_size(record: StepRecord) -> str:
    """The bytes donated; "unknown" where the executor did not say (torch_xla on a cache hit)."""
    if not record.donated and record.backend is not Backend.XLAKIT and record.cache is Cache.HIT:
        return "unknown"
    return human_bytes(record.donated_bytes)


def donation_table(record: StepRecord) -> str:
    if not record.donated:
        return _list_html(donation_lines(record))
    body = "".join(f"<tr><td>{_known(d.index)}</td><td>{html.escape(d.label or '(unlabelled)')}</td>"
                   f"<td>{_known(d.shape and list(d.shape))}</td><td>{_known(d.dtype)}</td>"
                   f"<td>{human_bytes(d.nbytes)}</td></tr>" for d in record.donated)
    note = f"<div>{_not_donated(record)}: {html.escape(record.donation_note)}</div>" if record.donation_note else ""
    return (f'<table class="xlakit-donation"><tr><th>input</th><th>label</th><th>shape</th><th>dtype</th>'
            f"<th>bytes</th></tr>{body}</table><div>total {human_bytes(record.donated_bytes)} reused</div>{note}")


def _not_donated(record: StepRecord) -> str:
    return "not donated" if record.backend is Backend.XLAKIT else "note"


# -- cache and time -----------------------------------------------------------------
def cache_line(record: StepRecord) -> str:
    if record.cache is Cache.HIT:
        return "cache hit" if record.uses is None else f"cache hit ({_ordinal(record.uses)} use)"
    if record.cache is Cache.PERSISTENT_HIT:
        return "persistent cache hit (loaded from disk, not compiled)"
    return "cache miss: compiled"


def timing_table(record: StepRecord) -> str:
    t = record.timings
    rows = [("cache", cache_line(record)), ("trace", _ms(t.trace)),
            *([("recording", html.escape(replay_line(record)))] if record.replay is not None else []),
            ("lower", _ms(t.lower)),
            ("compile", _ms(t.compile)), ("execute", _execute_ms(t)),
            ("executables cached", _known(record.cache_entries)),
            ("hit rate so far", _known(record.hit_rate, "{:.0%}"))]
    return '<table class="xlakit-timing">' + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) \
        + "</table>"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# -- the step view ------------------------------------------------------------------
def text(record: StepRecord, name: str | None = None, previous: StepRecord | None = None) -> str:
    """The step view's text, which marks the components changed since `previous`;
    without a name or a previous step, the record's repr."""
    changed = changed_components(record, previous)
    lines = summary_lines(record, name) + key_lines(record, changed)
    lines += [f"  why: {line}" for line in why_lines(record, previous)]
    lines += [f"  donation: {line}" for line in donation_lines(record)]
    lines += [f"  sharding: {line}" for line in sharding_view.summary_lines(record)]
    lines += [f"  memory: {line}" for line in panels.memory_lines(record)]
    lines.append(f"  cost: {panels.cost_line(record)}")
    lines += [f"  numerics: {line}" for line in numerics_view.lines(record)]
    return "\n".join(lines)


def changed_components(record: StepRecord, previous: StepRecord | None) -> set[str]:
    if previous is None:
        return set()
    changed = {c for c, v in record.components.items() if previous.components.get(c) != v}
    if record.metadata_digest != previous.metadata_digest:
        changed.add("metadata")
    return changed


def html_view(record: StepRecord, name: str | None = None, previous: StepRecord | None = None,
              hlo: bool = False) -> str:
    return "".join([STYLE, '<div class="xlakit-step">', _header_html(record, name),
                    *(section for _, section in sections_html(record, previous, hlo)), "</div>"])


def sections_html(record: StepRecord, previous: StepRecord | None, hlo: bool) -> list[tuple[str, str]]:
    """(title, html) per view section; the widget puts each in a tab."""
    sections = [
        ("Graph", "<h4>Graph</h4>" + graph_dot.step_html(record, previous)),
        ("Key", "<h4>Key</h4>" + key_table(record, changed_components(record, previous))),
        ("Why", "<h4>Why</h4>" + _list_html(why_lines(record, previous))),
        ("Donation", "<h4>Donation</h4>" + donation_table(record)),
        ("Cache and time", "<h4>Cache and time</h4>" + timing_table(record)),
        ("Memory", "<h4>Memory</h4>" + panels.memory_html(record)),
        ("Cost", "<h4>Cost</h4>" + panels.cost_html(record)),
        *profile_view.sections(record),
        *sharding_view.sections(record),
    ]
    if record.numerics is not None:
        sections.append(("Numerics", "<h4>Numerics</h4>" + numerics_view.html_panel(record)))
    if hlo:
        sections.append(("HLO", f"<h4>HLO</h4><pre>{html.escape(record.hlo or 'unknown')}</pre>"))
    return sections


def _known(value, form: str = "{}") -> str:
    return "unknown" if value is None else form.format(value)


def _list_html(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _execute_ms(t: Timings) -> str:
    return _ms(t.execute) if t.waited else f"{_ms(t.execute)} to dispatch (not waited for)"


# -- history ----------------------------------------------------------------------
def history_text(rows: list[tuple[str, StepRecord]]) -> str:
    lines = [f"{'#':>4} {'cell/name':<16} {'trigger':<10} {'key':<12} {'cache':<15} {'donated':>10} "
             f"{'peak memory':>11}"]
    for name, r in rows:
        lines.append(f"{r.index:>4} {name[:16]:<16} {r.trigger:<10} {r.key[:12]:<12} {r.cache:<15} "
                     f"{donated_size(r):>10} {_peak(r):>11}")
    return "\n".join(lines)


def history_html(rows: list[tuple[str, StepRecord]]) -> str:
    body = "".join(
        f"<tr><td>{r.index}</td><td>{html.escape(name)}</td><td>{r.trigger}</td><td>{r.key[:12]}</td>"
        f"<td>{r.cache}</td><td>{_ms(r.timings.compile)}</td><td>{_execute_ms(r.timings)}</td>"
        f"<td>{donated_size(r)}</td><td>{_peak(r)}</td></tr>" for name, r in rows)
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
    bar, height = 12, 100
    parts = [f'<div class="xlakit-scroll"><svg class="xlakit-history-plot" width="{len(rows) * (2 * bar + 4) + 10}" '
             f'height="{height + 16}" font-size="11" font-family="monospace">']
    for k, (_, r) in enumerate(rows):
        x = 5 + k * (2 * bar + 4)
        for j, (value, color) in enumerate(((r.timings.compile, "#f29900"), (r.timings.execute, "#1a73e8"))):
            h = max(1.0, value / peak * height)
            parts.append(f'<rect x="{x + j * bar}" y="{height - h:.1f}" width="{bar - 1}" height="{h:.1f}" '
                         f'fill="{color}"><title>step {r.index} {"compile" if j == 0 else "execute"} '
                         f'{_ms(value)}</title></rect>')
        parts.append(f'<text x="{x}" y="{height + 13}">{r.index}</text>')
    parts.append("</svg></div>")
    return "".join(parts)
