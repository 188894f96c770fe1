"""Run PyTorch's OpInfo sample inputs through xlakit and compare with eager.

`python -m xlakit.opinfo [--ops N] [--out docs/op_coverage.md]` writes the
coverage report; tests/test_opinfo.py runs a bounded subset in CI. An op is
"pass" (every sample equals eager), "fallback" (it ran eagerly on CPU, so it is
correct by construction), "error" (a clear exception) or "mismatch" (silently
wrong: the category that must stay empty).
"""
from __future__ import annotations

import argparse
import collections
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import api
from .frontend import DEVICE

SAMPLES_PER_OP = 3


def _to(value, device):
    return tree_map(lambda t: t.detach().to(device) if isinstance(t, torch.Tensor) else t, value)


def _close(got, want) -> bool:
    got_leaves, _ = tree_flatten(got)
    want_leaves, _ = tree_flatten(want)
    if len(got_leaves) != len(want_leaves):
        return False
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape:
                return False
            try:
                torch.testing.assert_close(g.cpu(), w, equal_nan=True, rtol=1e-4, atol=1e-5)
            except AssertionError:
                return False
        elif g != w and not (g != g and w != w):  # NaN == NaN here
            return False
    return True


def check_op(opinfo, dtype=torch.float32) -> tuple[str, str]:
    """(outcome, reason) for one OpInfo entry."""
    if "empty" in opinfo.name:
        return "skipped", "values are undefined (uninitialized memory)"
    try:
        samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))[:SAMPLES_PER_OP]
    except Exception as e:  # noqa: BLE001
        return "skipped", f"no samples: {type(e).__name__}"
    if not samples:
        return "skipped", "no samples"
    fell_back = False
    for sample in samples:
        try:
            torch.manual_seed(0)  # random ops draw from torch's CPU generator on both sides
            want = opinfo(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001 - eager itself rejects this sample
            continue
        fallbacks = api.metrics()["fallbacks"]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                got = opinfo(_to(sample.input, DEVICE), *_to(sample.args, DEVICE), **_to(sample.kwargs, DEVICE))
                got = _to(got, "cpu")
                api.mark_step()
        except Exception as e:  # noqa: BLE001 - recorded as the op's outcome
            try:
                api.mark_step()
            except Exception:  # noqa: BLE001 - the same failure, raised at the step
                pass
            if "torch' has no attribute '_lazy'" in str(e):
                return "skipped", "OpInfo's seeding wrapper calls torch._lazy (LTC) for 'lazy' devices"
            return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
        fell_back |= api.metrics()["fallbacks"] > fallbacks
        if not _close(got, want):
            return "mismatch", f"sample {sample.input.shape if isinstance(sample.input, torch.Tensor) else ''}"
    return ("fallback", "ran eagerly on CPU") if fell_back else ("pass", "")


def sweep(limit: int | None = None, names: list[str] | None = None) -> dict[str, tuple[str, str]]:
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if names is not None:
        ops = [o for o in ops if o.name in names]
    results = {}
    for opinfo in ops[:limit]:
        key = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
        results[key] = check_op(opinfo)
    return results


def report(results: dict[str, tuple[str, str]]) -> str:
    counts = collections.Counter(outcome for outcome, _ in results.values())
    lines = ["# Op coverage (PyTorch OpInfo, float32, eager CPU vs xlakit)", "",
             f"{len(results)} ops, up to {SAMPLES_PER_OP} samples each: " +
             ", ".join(f"{counts[k]} {k}" for k in ("pass", "fallback", "error", "mismatch", "skipped")), ""]
    for outcome in ("mismatch", "error", "fallback", "skipped", "pass"):
        names = sorted(n for n, (o, _) in results.items() if o == outcome)
        if not names:
            continue
        lines.append(f"## {outcome} ({len(names)})\n")
        by_reason = collections.defaultdict(list)
        for n in names:
            by_reason[results[n][1]].append(n)
        for reason, group in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- {reason or 'all samples equal eager'}: {', '.join(group)}")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=None, help="only the first N ops")
    parser.add_argument("--out", default="docs/op_coverage.md")
    args = parser.parse_args()
    text = report(sweep(args.ops))
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text.splitlines()[2])


if __name__ == "__main__":
    main()
