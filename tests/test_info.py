"""`python -m xlakit info` (xlakit/environment.py): the text a bug report asks for, true of
the process it runs in, and a version outside the tested ranges flagged."""
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
from packaging.specifiers import SpecifierSet

from xlakit import environment
from xlakit.config import private_dir
from xlakit.notebook.graph_widget import BUNDLE

ROOT = Path(__file__).resolve().parent.parent


def row(text: str, name: str) -> str:
    found = re.search(rf"^  {re.escape(name)} .*$", text, re.M)
    assert found, (name, text)
    return found.group(0)


def test_python_m_xlakit_info_reports_this_process_stack(tmp_path):
    cached = private_dir(str(tmp_path))
    cached.mkdir()
    (cached / "entry").write_bytes(b"x" * 3 * 1024)
    result = subprocess.run([sys.executable, "-m", "xlakit", "info"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "XLAKIT_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert row(text, "Python").split()[1] == platform.python_version()
    for name in ("torch", "jax", "jaxlib", "ipywidgets", "anywidget"):  # every column is inside the ranges
        assert row(text, name).split()[1] == importlib.metadata.version(name) and row(text, name).endswith(" ok")
    if importlib.util.find_spec("torch_xla"):
        assert row(text, "torch_xla").split()[1] == importlib.metadata.version("torch_xla")
    else:
        assert "not installed" in row(text, "torch_xla")
    first = jax.devices()[0]
    assert re.search(rf"^  {first.platform}:0 {re.escape(first.device_kind)}: (memory not reported|.+ in use of .+)$",
                     text, re.M), text
    assert f"  {cached} (XLAKIT_CACHE_DIR): 1 files, 3.0 KiB" in text
    assert f"graph widget bundle: {BUNDLE} (" in text and "MISSING" not in text
    assert ("graphviz version" in row(text, "graphviz")) == (shutil.which("dot") is not None)


def test_a_version_outside_the_tested_ranges_is_flagged(monkeypatch):
    installed = importlib.metadata.version
    faked = {"torch": "2.99.0", "anywidget": "0.9.21", "jax": "0.7.1"}

    def version(name):
        if name == "torch_xla":
            raise importlib.metadata.PackageNotFoundError(name)
        return faked.get(name) or installed(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    text = "\n".join(environment.versions())
    assert row(text, "torch").split()[1] == "2.99.0" and row(text, "torch").endswith("OUTSIDE the tested range")
    assert row(text, "jax").split()[1] == "0.7.1" and row(text, "jax").endswith("OUTSIDE the tested range")
    assert row(text, "anywidget").endswith(" ok")  # the lowest its range admits
    assert "not installed" in row(text, "torch_xla") and row(text, "torch_xla").endswith('pip install "xlakit[torch_xla]"')
    # the ranges shown are pyproject's dependencies (torch's, not the torch_xla extra's pin)
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_range = SpecifierSet(next(d for d in dependencies if re.match(r"torch\b", d)).removeprefix("torch"))
    assert SpecifierSet(row(text, "torch").split()[3]) == torch_range
