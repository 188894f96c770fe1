"""What a bug report needs to say about the machine, as plain text to paste
(`python -m xlakit info`, `xlakit.info()`): the versions of xlakit's stack and
whether each is inside the ranges xlakit is tested with, the devices JAX sees and
their memory, the cache directory and its size, and whether Graphviz `dot` and
the graph widget's JavaScript are there. Versions come from the installed
packages' metadata, so a broken package is reported rather than imported.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .config import default_cache_dir, private_dir
from .version import __version__

STACK = ("torch", "torch_xla", "jax", "jaxlib", "ipywidgets", "anywidget")
OPTIONAL = {"torch_xla": 'pip install "xlakit[torch_xla]"'}
# A checkout (tests, `make`) states its ranges in pyproject.toml, which an installed
# package's metadata copies; read the checkout's own, so it is never a stale copy.
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def tested_ranges() -> tuple[dict[str, SpecifierSet], SpecifierSet]:
    """The range xlakit is tested with for each package it names (its dependencies, then its
    extras: torch_xla's pin comes from the torch_xla extra), and for Python."""
    project = tomllib.loads(PYPROJECT.read_text()).get("project", {}) if PYPROJECT.is_file() else {}
    if project.get("name") == "xlakit":
        requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
        python = project["requires-python"]
    else:
        requirements = metadata.requires("xlakit") or []
        python = metadata.metadata("xlakit")["Requires-Python"]
    ranges: dict[str, SpecifierSet] = {}
    for text in requirements:
        requirement = Requirement(text)
        ranges.setdefault(canonicalize_name(requirement.name), requirement.specifier)  # the first: dependencies
    return ranges, SpecifierSet(python)


def _verdict(version: str, tested: SpecifierSet) -> str:
    try:
        inside = tested.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return "not a version pip understands"
    return "ok" if inside else "OUTSIDE the tested range"


def versions() -> list[str]:
    ranges, python = tested_ranges()
    rows = [("Python", platform.python_version(), str(python), _verdict(platform.python_version(), python))]
    for name in STACK:
        tested = ranges.get(canonicalize_name(name), SpecifierSet())
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            rows.append((name, "not installed", str(tested),
                         f"optional: {OPTIONAL[name]}" if name in OPTIONAL else "MISSING: xlakit needs it"))
            continue
        rows.append((name, version, str(tested) or "any", _verdict(version, tested)))
    return [f"  {name:<11} {version:<15} tested {tested:<16} {verdict}".rstrip() for name, version, tested, verdict in rows]


def devices() -> list[str]:
    """Each device JAX sees, with its memory where the backend reports it."""
    try:
        import jax

        found = jax.devices()
    except Exception as e:  # noqa: BLE001 - a backend that fails to start is what the report is for
        return [f"  JAX found no devices: {type(e).__name__}: {e}"]
    lines = [f"  default backend {jax.default_backend()}, {len(found)} device(s)"]
    for device in found:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        memory = ("memory not reported" if not stats else
                  f"{_size(stats.get('bytes_in_use', 0))} in use of {_size(stats.get('bytes_limit', 0))}")
        lines.append(f"  {device.platform}:{device.id} {device.device_kind}: {memory}")
    return lines


def cache() -> list[str]:
    path = default_cache_dir()
    where = "XLAKIT_CACHE_DIR" if "XLAKIT_CACHE_DIR" in os.environ else "the default"
    if path is None:
        return ["  off (XLAKIT_CACHE_DIR is empty)"]
    own = private_dir(path)
    files = [p for p in own.rglob("*") if p.is_file()] if own.is_dir() else []
    return [f"  {own} ({where}): {len(files)} files, {_size(sum(p.stat().st_size for p in files))}"]


def tools() -> list[str]:
    """Graphviz `dot` (the static graph's layout) and the graph widget's JavaScript."""
    dot = shutil.which("dot")
    if dot:
        found = subprocess.run([dot, "-V"], capture_output=True, text=True, timeout=30)
        lines = [f"  graphviz dot: {dot} ({(found.stderr or found.stdout).strip()})"]
    else:
        lines = ["  graphviz dot: not found (the static graph uses xlakit's own layout; apt install graphviz)"]
    try:
        from .notebook.graph_widget import BUNDLE
    except Exception as e:  # noqa: BLE001 - anywidget missing, or it refused a missing bundle: report either
        return lines + [f"  graph widget: does not import ({type(e).__name__}: {e})"]
    state = f"{_size(BUNDLE.stat().st_size)}" if BUNDLE.is_file() else "MISSING: the package is incomplete, reinstall it"
    return lines + [f"  graph widget bundle: {BUNDLE} ({state})"]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def text() -> str:
    where = Path(__file__).resolve().parent
    sections = [(f"xlakit {__version__} ({where})", [f"  {platform.platform()}, {sys.executable}"]),
                ("versions", versions()), ("devices", devices()), ("cache", cache()), ("notebook pieces", tools())]
    return "\n".join(line for title, lines in sections for line in [title, *lines])


def info() -> None:
    """Print what a bug report needs: versions and tested ranges, devices, cache, Graphviz, widget."""
    print(text())
