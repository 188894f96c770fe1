"""How users install xlakit: the notebooks' install cell, the Colab and Binder links,
and the ranges pyproject.toml states (docs/versions.md's tested-versions matrix)."""
import json
import pathlib
import re
import subprocess
import tomllib

from IPython.core.inputtransformer2 import TransformerManager
from packaging.specifiers import SpecifierSet

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# where each badge's link points, inside this repository on the default branch
LINKS = [r"colab\.research\.google\.com/github/xlakit/xlakit/blob/main/([^)\s]+)",
         r"mybinder\.org/v2/gh/xlakit/xlakit/main\?urlpath=lab/tree/([^)\s]+)"]


def tracked_files() -> set[str]:
    return set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.split())


def test_every_colab_and_binder_link_points_at_a_tracked_file():
    texts = [(ROOT / "README.md").read_text()] + [p.read_text() for p in NOTEBOOKS]
    targets = {m for text in texts for pattern in LINKS for m in re.findall(pattern, text)}
    assert {f"notebooks/{p.name}" for p in NOTEBOOKS} <= targets  # every notebook has its Colab badge
    assert targets <= tracked_files()


def test_each_notebook_installs_xlakit_from_its_repository_in_one_cell_ci_skips():
    for path in NOTEBOOKS:
        cells = [c for c in json.loads(path.read_text())["cells"]
                 if c["cell_type"] == "code" and "%pip install" in "".join(c["source"])]
        assert len(cells) == 1, path.name
        source = "".join(cells[0]["source"])
        assert source.startswith("# NBVAL_SKIP")
        assert '%pip install "xlakit @ git+https://github.com/xlakit/xlakit"' in source
        assert "-U" not in source and "--upgrade" not in source  # Colab's torch, jax and libtpu stay
        compile(TransformerManager().transform_cell(source), path.name, "exec")  # valid IPython


def test_pyproject_admits_the_tested_versions_and_no_torchax():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = " ".join(project["dependencies"])
    assert "torchax" not in dependencies  # it does not import on torch 2.13
    for name, tested in [("torch", ["2.9.0", "2.13.0", "2.14.1"]), ("jax", ["0.7.2", "0.10.2"]),
                         ("ipywidgets", ["7.7.1", "8.1.7"])]:
        spec = next(d for d in project["dependencies"] if re.match(rf"{name}\b", d))
        for version in tested:
            assert version in SpecifierSet(spec.removeprefix(name)), (spec, version)
