"""The package as users get it. `python -m build` makes the sdist and, from it, the wheel (what
`make dist` makes); the wheel goes into a fresh venv with one column's runtime pins
(requirements-latest.txt: torch's CPU build, the smallest), used from a temporary folder with no
checkout on sys.path. There every public name imports, `python -m xlakit info` finds the
package's files, and notebooks/01_quickstart.ipynb runs top to bottom with nbclient: a file the
package needs and the wheel lacks fails here, not on a user's machine.

It takes about 45 s here with an empty uv cache, as CI runs (a build, a venv, torch and jax installed,
two new processes): so it runs when XLAKIT_TEST_WHEEL=1, which `make test-wheel` sets and .ci/run
runs once, not in every column."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STACK = ROOT / "requirements-latest.txt"
QUICKSTART = ROOT / "notebooks" / "01_quickstart.ipynb"


def runtime_pins() -> list[str]:
    """The column's own pins (torch, jax, ipywidgets), without the test tools it includes (-r)."""
    lines = (line.split("#")[0].strip() for line in STACK.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def tools_pin(name: str) -> str:
    """`name`'s pin in requirements-tools.txt: the version the other tests run."""
    return re.search(rf"^{name}==\S+", (ROOT / "requirements-tools.txt").read_text(), re.M).group(0)


def copy_source_tree(dest: Path) -> None:
    """The checkout as a clean clone has it: git's files, committed or not, ignored ones left out.
    No build leftovers: setuptools reads an old xlakit.egg-info's file list into a new sdist, which
    kept a file in the wheel that pyproject.toml no longer ships."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():   # a tracked file deleted in the work tree is gone
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def run(argv: list, cwd: Path, env: dict, timeout: int) -> str:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, argv))[:300]}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result.stdout


# Inserted first in the copy of the quickstart, so that the notebook's kernel (the venv's Python,
# one process for both) checks the installed package before it runs the quickstart.
KERNEL_CHECK = textwrap.dedent("""
    import sys
    from importlib import metadata
    from pathlib import Path
    import xlakit
    assert sys.prefix == VENV and Path(xlakit.__file__).is_relative_to(sys.prefix), (sys.prefix, xlakit.__file__)
    for name in xlakit.__all__ + ["load_ipython_extension"]:
        getattr(xlakit, name)   # the notebook's names import on first use: this imports them
    (backend,) = [e for e in metadata.entry_points(group="torch_dynamo_backends") if e.name == "xlakit"]
    assert callable(backend.load())   # torch.compile(backend="xlakit") finds it
""")

EXECUTE = textwrap.dedent("""
    import sys
    import nbformat
    from nbclient import NotebookClient
    path, check = sys.argv[1], sys.argv[2]
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(check))
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    print("executed", len(notebook.cells), "cells")
""")


@pytest.mark.skipif(os.environ.get("XLAKIT_TEST_WHEEL") != "1", reason="slow: make test-wheel runs it")
def test_the_wheel_alone_imports_reports_and_runs_the_quickstart():
    with tempfile.TemporaryDirectory(prefix="xlakit-wheel-") as tmp:   # a venv is ~1 GB: gone after
        tmp = Path(tmp)
        copy_source_tree(tmp / "source")
        run([sys.executable, "-m", "build", "--outdir", tmp / "dist", tmp / "source"], tmp, dict(os.environ), 600)
        (wheel,) = (tmp / "dist").glob("xlakit-*.whl")

        # no checkout on sys.path, no venv of the tests' (pip's cache stays: it is the caller's)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["XLAKIT_CACHE_DIR"] = str(tmp / "cache")
        venv = tmp / "venv"
        python = venv / "bin" / "python"
        run([sys.executable, "-m", "venv", venv], tmp, env, 300)
        # The stack by uv, from its cache (pip's download and bytecode compile took 50 s of this
        # test's 73), then the wheel by pip, as users install it: pip checks its requirements against what
        # is there. The stack's bytecode is left to the two processes that import it (11 s more in all).
        uv = Path(sys.executable).with_name("uv")   # the Makefile's, with pip's find-links (UV_FIND_LINKS)
        run([uv, "pip", "install", "-q", "--python", python, *runtime_pins(), "nbclient", "ipykernel",
             tools_pin("transformers")], tmp, env, 1200)
        run([python, "-m", "pip", "install", "-q", wheel], tmp, env, 600)

        report = run([python, "-m", "xlakit", "info"], tmp, env, 300)
        assert f"graph widget bundle: {venv}" in report and "MISSING" not in report, report
        assert re.search(r"^  torch .* ok$", report, re.M), report   # the ranges, read from the wheel's metadata

        work = tmp / "work"
        work.mkdir()
        shutil.copy(QUICKSTART, work)
        run([python, "-c", EXECUTE, QUICKSTART.name, f"VENV = {str(venv)!r}\n{KERNEL_CHECK}"], work, env, 1200)
