"""The Numerics panel of a step view (rec.numerics): the op that made the
step's first NaN or infinity (config.check_nans), and per module how large its
values got against its dtype's limits (config.record_ranges, %%xla_step
--ranges), as plain text and as static HTML (bars on one log scale for all rows,
each over its dtype's range).

A module is marked *near overflow* when its largest value is within 2^4 of its
dtype's largest finite value in bfloat16 or float16 (the dtypes a training
run overflows in), and *underflows* when all its values are zero or below the
dtype's smallest normal number.
"""
from __future__ import annotations

import html
import math

from ..core.record import ModuleRange, NonFinite, StepRecord

NEAR = 2 ** 4            # headroom below which a low-precision module is marked
LOW_PRECISION = ("bf16", "f16")
WORST = 3                # modules the text view names


def near_overflow(r: ModuleRange) -> bool:
    return r.dtype in LOW_PRECISION and r.headroom < NEAR


def module_name(path: str) -> str:
    return path or "(top level)"


def worst(ranges: dict[str, ModuleRange], count: int = WORST) -> list[tuple[str, ModuleRange]]:
    """The modules closest to their dtype's largest value, closest first."""
    return sorted(ranges.items(), key=lambda item: item[1].headroom)[:count]


def nonfinite_line(found: NonFinite) -> str:
    where = " at " + _where(found.source) if found.source is not None else ""
    module = f" in {found.module}" if found.module else ""
    made = "NaN" if found.kind == "nan" else "infinity"
    inputs = "; ".join(f"input {i} min {r[0]:.4g} max {r[1]:.4g}" for i, r in enumerate(found.inputs) if r)
    forward = found.source.forward if found.source is not None else None
    gradient = (f", the gradient of {_where(forward)}{f' in {forward.module}' if forward.module else ''}"
                if forward is not None else "")
    return f"first {made} made by {found.op}{module}{where}{gradient}" + (f" ({inputs})" if inputs else "")


def _where(source) -> str:
    return " -> ".join(f"{f.file.rsplit('/', 1)[-1]}:{f.line}" for f in (source.user, source.library) if f is not None)


def lines(record: StepRecord) -> list[str]:
    """The text view's numerics lines ([] when neither check_nans nor ranges was on)."""
    n = record.numerics
    if n is None:
        return []
    out = []
    if n.first_nonfinite is not None:
        out.append(nonfinite_line(n.first_nonfinite))
    if n.ranges:
        named = ", ".join(f"{module_name(path)} {_headroom(r)}" for path, r in worst(n.ranges))
        out.append(f"closest to overflow: {named}")
        near = [module_name(p) for p, r in n.ranges.items() if near_overflow(r)]
        if near:
            out.append(f"within 2^4 of overflow: {', '.join(near)}")
        under = [module_name(p) for p, r in n.ranges.items() if r.underflows]
        if under:
            out.append(f"underflow to zero: {', '.join(under)}")
    if n.nans_checked and n.first_nonfinite is None:
        out.insert(0, _no_origin(n))
    return out


def _no_origin(n) -> str:
    if n.in_updates:
        return ("its outputs hold a NaN or infinity made in its in-place updates of donated buffers, from finite "
                "values: not searched (config.donate = False for one step names the op)")
    if n.nonfinite_outputs:
        return ("its outputs hold a NaN or infinity that no op of this step made "
                "(it came with the inputs, or an op asked for it, as masked_fill(-inf) does)")
    return "no op made a NaN or infinity"


def _headroom(r: ModuleRange) -> str:
    if r.absmax == 0:
        return f"(all zero, {r.dtype})"
    return f"(max {r.absmax:.3g}, 2^{math.log2(r.headroom):.1f} below {r.dtype}'s largest)"


def html_panel(record: StepRecord) -> str:
    n = record.numerics
    parts = []
    if n.first_nonfinite is not None:
        parts.append(f'<div class="xlakit-warning">&#9888; {html.escape(nonfinite_line(n.first_nonfinite))}</div>')
    elif n.nans_checked:
        line = _no_origin(n)
        parts.append(f"<div>{html.escape(line[0].upper() + line[1:])}.</div>")
    if n.ranges:
        rows = sorted(n.ranges.items(), key=lambda item: item[1].headroom)
        scale = (min(math.log2(r.tiny) for _, r in rows), max(math.log2(r.limit) for _, r in rows))
        parts.append("<div>The largest absolute value each module's ops computed (forward, "
                     "<code>backward.&lt;module&gt;</code> for the gradients into it, <code>optimizer</code>). "
                     f"Each bar is on one log2 scale, from 2^{scale[0]:.0f} to 2^{scale[1]:.0f}, the same for every "
                     "row: its grey band is the row's dtype's range (smallest normal value to largest finite "
                     "value), the bar ends at the module's largest value, so bars of different dtypes compare. "
                     "Marked: within 2^4 of overflow in bf16/f16, and underflowing to zero.</div>")
        parts.append('<table class="xlakit-numerics"><tr><th>module</th><th>dtype</th><th>abs max</th>'
                     f"<th>headroom</th><th>on one log2 scale</th><th>mark</th></tr>"
                     f"{''.join(_row(path, r, scale) for path, r in rows)}</table>")
    return "".join(parts)


BAR_WIDTH = 300


def _row(path: str, r: ModuleRange, scale: tuple[float, float]) -> str:
    def x(log2: float) -> float:
        return (log2 - scale[0]) / (scale[1] - scale[0]) * BAR_WIDTH

    low, high = math.log2(r.tiny), math.log2(r.limit)
    at = min(max(math.log2(r.absmax), low), high) if r.absmax > 0 else low
    mark = "near overflow" if near_overflow(r) else "underflows" if r.underflows else ""
    color = "#d93025" if mark == "near overflow" else "#f9ab00" if mark else "#1a73e8"
    headroom = "&infin;" if r.absmax == 0 else f"2^{math.log2(r.headroom):.1f}"
    bar = (f'<svg width="{BAR_WIDTH}" height="10"><rect x="{x(low):.1f}" width="{x(high) - x(low):.1f}" '
           f'height="10" fill="#e8eaed"><title>{r.dtype}: 2^{low:.0f} to 2^{high:.0f}</title></rect>'
           f'<rect class="xlakit-bar" x="{x(low):.1f}" y="2" width="{max(1.0, x(at) - x(low)):.1f}" height="6" '
           f'fill="{color}"/></svg>')
    return (f'<tr class="{mark.replace(" ", "-")}"><td>{html.escape(module_name(path))}</td><td>{r.dtype}</td>'
            f"<td>{r.absmax:.3g}</td><td>{headroom}</td><td>{bar}</td><td>{mark}</td></tr>")
