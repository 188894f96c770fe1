"""Run PyTorch's OpInfo sample inputs through xlakit and compare with eager.

`python -m xlakit.integrations.opinfo [--ops N] [--names a,b] [--dtypes all|float32,...] [--out FILE]`
writes the coverage report (docs/op_coverage.md: float32; docs/op_coverage_dtypes.md: the other dtypes
eager CPU runs each op in); tests/test_opinfo.py runs a bounded subset in CI. An op is
"pass" (every sample equals eager), "fallback" (it ran eagerly on CPU, so it is
correct by construction), "error" (a clear exception) or "mismatch" (silently
wrong: the category that must stay empty). Where eager's own answer is one of
several right ones (singular vector signs) or depends on storage
a lazy tensor does not have, the comparison says so in the outcome's reason.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import unittest.mock
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .. import session
from ..config import config
from ..front import install
from ..front.recorder import DEVICE

SAMPLES_PER_OP = 3

# Singular vectors are unique only up to sign (torch.linalg.svd's documentation):
# LAPACK's choice and XLA's differ. Compared after giving each singular pair the
# signs of eager's U; a U column flipped without its V column still fails.
# op -> whether its third output is V (columns) or Vh (rows).
_SVD_LIKE = {"svd": "V", "svd_lowrank": "V", "pca_lowrank": "V", "linalg.svd": "Vh"}

# These ops address storage: a lazy tensor, like any tensor copied to another
# device, owns just its own elements in row-major order (its stride() and
# storage_offset() say so), not the storage around an OpInfo view. Eager runs
# on the same: a contiguous copy.
_STORAGE_OPS = {"as_strided", "as_strided_copy", "as_strided_scatter"}

# OpInfo makes these ops' index tensors on the CPU for every device (PyTorch
# requires them there): only the input moves.
_HOST_ARGS = {"tensor_split"}


def _to(value, device):
    return tree_map(lambda t: t.detach().to(device) if isinstance(t, torch.Tensor) else t, value)


def _contiguous(value):
    return tree_map(lambda t: t.detach().clone(memory_format=torch.contiguous_format)
                    if isinstance(t, torch.Tensor) else t, value)


def _align_singular_vectors(got, want, v_layout: str):
    """got's (U, S, V or Vh) with each singular pair's sign flipped to match want's U."""
    u, s, v = (t.cpu() for t in got)
    if u.shape != want[0].shape:
        return got
    sign = torch.sgn((u.conj() * want[0]).sum(-2))  # per column: +1 or -1 (real), a phase (complex)
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    v = v * (sign.unsqueeze(-2) if v_layout == "V" else sign.conj().unsqueeze(-1))
    return u * sign.unsqueeze(-2), s, v


# Eigenvectors are unique up to sign (phase), as singular vectors are (a Hermitian
# matrix's, and a general one's, both normalized to length 1): compared after giving
# each column eager's phase.
_EIGH_LIKE = {"linalg.eigh", "linalg.eig"}


def _align_eigenvectors(got, want):
    values, vectors = (t.cpu() for t in got)
    if vectors.shape != want[1].shape:
        return got
    phase = (vectors.conj() * want[1]).sum(-2)
    phase = torch.where(phase == 0, torch.ones_like(phase), phase / phase.abs())
    return values, vectors * phase.unsqueeze(-2)


_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)
# float32 and wider: XLA's and eager's kernels sum and round in another order. Every other dtype
# takes torch.testing's own tolerance for it: exact for integers, about one unit in the last place
# for float16 and bfloat16; float8 exact.
_TOLERANCE = {d: dict(rtol=1e-4, atol=1e-5) for d in (torch.float32, torch.float64, torch.complex64, torch.complex128)}
_TOLERANCE.update({d: dict(rtol=0, atol=0) for d in _FLOAT8})


def _close(got, want) -> bool:
    got_leaves, _ = tree_flatten(got)
    want_leaves, _ = tree_flatten(want)
    if len(got_leaves) != len(want_leaves):
        return False
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape:
                return False
            g = g.cpu()
            if w.dtype in _FLOAT8:  # torch.testing compares no float8: their values, bit for bit
                g, w = g.float(), w.float()
            try:
                torch.testing.assert_close(g, w, equal_nan=True, **_TOLERANCE.get(w.dtype, {}))
            except AssertionError:
                return False
        elif g != w and not (g != g and w != w):  # NaN == NaN here
            return False
    return True


# float16 and bfloat16 kernels round where eager's do not (eager's half kernels accumulate in
# float32 and round once; XLA's may round between ops), and eager's uint8 resampling computes in
# float and rounds its own way. Such a result is as right as eager's when it is as close to the
# float32 answer (eager on the same inputs, cast up) as eager's own is: within twice eager's
# spread from it, element by element, plus torch.testing's tolerance for the dtype.
_HALF = (torch.float16, torch.bfloat16)
# torch.testing.assert_close's documented defaults: (rtol, atol)
_DEFAULT_TOLERANCE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
_ROUNDED_RESAMPLING = ("interpolate", "upsample")


def _spread_rule_applies(name: str, dtype) -> bool:
    return dtype in _HALF or (dtype == torch.uint8 and any(word in name for word in _ROUNDED_RESAMPLING))


def _within_eager_spread(got, want, reference, dtype) -> bool:
    """Each output of `got` at most twice as far from `reference` (float32) as `want` is."""
    got_leaves, want_leaves, ref_leaves = (tree_flatten(v)[0] for v in (got, want, reference))
    if not len(got_leaves) == len(want_leaves) == len(ref_leaves):
        return False
    for g, w, r in zip(got_leaves, want_leaves, ref_leaves):
        if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point and w.dtype != torch.uint8:
            if not _close(g, w):
                return False
            continue
        if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape or r.shape != w.shape:
            return False
        g, w, r = g.cpu().double(), w.double(), r.double()
        rtol, atol = _DEFAULT_TOLERANCE.get(dtype, (0.0, 0.5))  # uint8: half a unit of rounding
        allowed = 2 * (w - r).abs() + atol + rtol * r.abs()
        finite = torch.isfinite(r) & torch.isfinite(w)
        if not (((g - r).abs() <= allowed) | ~finite & ((g == w) | g.isnan() & w.isnan())).all():
            return False
    return True


def _float32_reference(opinfo, inp, args, kwargs):
    """Eager's answer on the inputs cast to float32 (None where eager refuses them)."""
    up = tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and (t.dtype in _HALF or t.dtype == torch.uint8)
                  else t, (inp, args, kwargs))
    try:
        torch.manual_seed(0)
        return opinfo(up[0], *up[1], **up[2])
    except Exception:  # noqa: BLE001 - no float32 reference: the strict comparison stands
        return None


# For half inputs eager CPU's kernels return these ops' saved statistics (mean, 1/std) in the
# input's dtype; torch's meta kernels, which set xlakit's dtypes, and eager CUDA's return them in
# float32. Compared after casting them to eager CPU's dtype.
_STATS_IN_FLOAT32 = {"native_batch_norm", "_native_batch_norm_legit", "native_layer_norm"}


def _stats_as_eager(got, want):
    """got's outputs with its float32 statistics in want's dtypes."""
    return tuple(g.to(w.dtype) if k and g.dtype == torch.float32 else g for k, (g, w) in enumerate(zip(got, want)))


# Sorts without `stable=True` may order tied elements either way, and topk and kthvalue pick
# any of the tied ones: the indices are right when they pick the same values. Per op, where
# its `dim` argument sits (its default: the last dim).
_TIES = {"sort": 0, "argsort": 0, "topk": 1, "kthvalue": 1}


def _ties_agree(name: str, inp, args, kwargs, got, want) -> bool:
    if kwargs.get("stable") or not isinstance(inp, torch.Tensor) or inp.ndim == 0:
        return False
    got_values, got_idx = (None, got) if name == "argsort" else (got[0], got[1])
    want_values, want_idx = (None, want) if name == "argsort" else (want[0], want[1])
    if got_values is not None and not _close(got_values, want_values):
        return False
    dim = kwargs.get("dim", args[_TIES[name]] if len(args) > _TIES[name] else -1)
    got_idx = got_idx.cpu()
    if got_idx.dtype != want_idx.dtype or got_idx.shape != want_idx.shape:
        return False
    if name == "kthvalue" and not kwargs.get("keepdim", len(args) > 2 and args[2]):
        got_idx, want_idx = got_idx.unsqueeze(dim), want_idx.unsqueeze(dim)
    picked, wanted = inp.gather(dim, got_idx), inp.gather(dim, want_idx)
    if name in ("sort", "argsort") and not torch.equal(got_idx.sort(dim).values, want_idx.sort(dim).values):
        return False  # a sort's indices are a permutation
    return torch.equal(picked, wanted) or bool(((picked == wanted) | picked.isnan() & wanted.isnan()).all())


def check_op(opinfo, dtype=torch.float32) -> tuple[str, str]:
    """(outcome, reason) for one OpInfo entry."""
    name = opinfo.name
    if "empty" in name:
        return "skipped", "values are undefined (uninitialized memory)"
    try:
        samples = list(itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=False), SAMPLES_PER_OP))
    except Exception as e:  # noqa: BLE001
        return "skipped", f"no samples: {type(e).__name__}"
    if not samples:
        return "skipped", "no samples"
    fell_back = aligned = spread = tied = stats = False
    for sample in samples:
        inp, args, kwargs = sample.input, sample.args, sample.kwargs
        if name in _STORAGE_OPS:
            inp, args, kwargs = _contiguous((inp, args, kwargs))
        try:
            torch.manual_seed(0)  # random ops draw from torch's CPU generator on both sides
            want = opinfo(inp, *args, **kwargs)
        except Exception:  # noqa: BLE001 - eager itself rejects this sample
            continue
        fallbacks = session.metrics()["fallbacks"]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                got = opinfo(_to(inp, DEVICE), *(args if name in _HOST_ARGS else _to(args, DEVICE)),
                             **_to(kwargs, DEVICE))
                got = _to(got, "cpu")
                session.mark_step()
        except Exception as e:  # noqa: BLE001 - recorded as the op's outcome
            try:
                session.mark_step()
            except Exception:  # noqa: BLE001 - the same failure, raised at the step
                pass
            if "torch' has no attribute '_lazy'" in str(e):
                return "skipped", "OpInfo's seeding wrapper calls torch._lazy (LTC) for 'lazy' devices"
            return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
        fell_back |= session.metrics()["fallbacks"] > fallbacks
        if not _close(got, want) and name in _SVD_LIKE:
            got = _align_singular_vectors(got, want, _SVD_LIKE[name])
            aligned = True
        if not _close(got, want) and name in _EIGH_LIKE:
            got = _align_eigenvectors(got, want)
            aligned = True
        if name in _STATS_IN_FLOAT32 and dtype in _HALF:
            got, stats = _stats_as_eager(got, want), True
        if not _close(got, want) and name in _TIES and _ties_agree(name, inp, args, kwargs, got, want):
            tied = True
            continue
        if not _close(got, want) and _spread_rule_applies(name, dtype):
            reference = _float32_reference(opinfo, inp, args, kwargs)
            if reference is not None and _within_eager_spread(got, want, reference, dtype):
                spread = True
                continue
        if not _close(got, want):
            return "mismatch", f"sample {inp.shape if isinstance(inp, torch.Tensor) else ''}"
    notes = [note for note, applies in (
        ("ran eagerly on CPU, in whole or in part", fell_back),
        ("equal once each singular pair takes eager's sign (the sign is arbitrary)", aligned and name in _SVD_LIKE),
        ("equal once each eigenvector takes eager's sign (the sign is arbitrary)", aligned and name in _EIGH_LIKE),
        ("equal on a contiguous input (lazy tensors share no storage with a base)", name in _STORAGE_OPS),
        ("as close to eager's float32 answer as eager's own (within twice its spread)", spread),
        ("tied elements in another order or pick (values equal; not stable=True)", tied),
        ("statistics in float32, as torch's meta kernel and eager CUDA give them (eager CPU: the input's dtype)",
         stats),
    ) if applies]
    return ("fallback" if fell_back else "pass"), "; ".join(notes)


def sweep(limit: int | None = None, names: list[str] | None = None,
          dtypes: list[torch.dtype] | None = None) -> dict[str, tuple[str, str]]:
    """Per op (and dtype, as `name@dtype`, but float32's), its outcome. `dtypes`: those of each op's
    that eager CPU supports to run it in (None: float32 alone; an empty list: every one)."""
    import torch._lazy
    from torch.testing._internal.common_methods_invocations import op_db

    install.install()

    ops = [o for o in op_db if names is None or o.name in names]
    results = {}
    # OpInfo's seeding wrapper (random ops) ends with a step marker on a "lazy"
    # device through PyTorch's own lazy-tensor runtime: here, xlakit's. No host copies of
    # uploads: a read of integer ops on them would be eager's answer (front/host_reads.py),
    # not the lowering's.
    with unittest.mock.patch.object(torch._lazy, "mark_step", lambda *args, **kwargs: session.mark_step()), \
            unittest.mock.patch.object(config, "host_copy_bytes", 0):
        for opinfo in ops[:limit]:
            key = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
            supported = opinfo.supported_dtypes("cpu")
            for dtype in sorted(supported, key=str) if dtypes == [] else (dtypes or [torch.float32]):
                if dtype in supported:
                    short = str(dtype).removeprefix("torch.")
                    results[key if dtype == torch.float32 else f"{key}@{short}"] = check_op(opinfo, dtype)
    return results


_DTYPES_NOTE = """Written by `python -m xlakit.integrations.opinfo --dtypes all --out docs/op_coverage_dtypes.md`
(about 20 minutes on 2 cores; float32 alone is [op_coverage.md](op_coverage.md)). Compared: float32 and
wider as there; integers, bool and float8 exactly; float16 and bfloat16 at torch.testing's tolerance, or
else within twice eager's own distance from its float32 answer (eager's half kernels round where XLA's
may not), as uint8 resampling is; unstable sorts' ties by the values they pick. Each reason below says
which rule passed an op. The errors are complex32, which XLA does not have, and sparse layouts."""


def report(results: dict[str, tuple[str, str]], dtypes: str = "float32") -> str:
    counts = collections.Counter(outcome for outcome, _ in results.values())
    what = "ops" if dtypes == "float32" else "(op, dtype) pairs, written op@dtype"
    lines = [f"# Op coverage (PyTorch OpInfo, {dtypes}, eager CPU vs xlakit)", "",
             f"{len(results)} {what}, up to {SAMPLES_PER_OP} samples each: " +
             ", ".join(f"{counts[k]} {k}" for k in ("pass", "fallback", "error", "mismatch", "skipped")), ""]
    if dtypes != "float32":
        lines += [_DTYPES_NOTE, ""]
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
    parser.add_argument("--names", default=None, help="only these OpInfo names, comma-separated")
    parser.add_argument("--dtypes", default="float32",
                        help="comma-separated (float16,uint32,...), or 'all': each dtype eager CPU runs the op in")
    parser.add_argument("--out", default="docs/op_coverage.md")
    args = parser.parse_args()
    dtypes = [] if args.dtypes == "all" else [getattr(torch, d) for d in args.dtypes.split(",")]
    text = report(sweep(args.ops, args.names.split(",") if args.names else None, dtypes), args.dtypes)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text.splitlines()[2])


if __name__ == "__main__":
    main()
