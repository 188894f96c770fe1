"""How users install xlakit: one install line made from the repository address pyproject.toml
states, the notebooks' install cell, the Colab and Binder links, and the ranges pyproject.toml
states (docs/versions.md's tested-versions matrix). tests/test_wheel.py installs the package."""
import json
import pathlib
import re
import subprocess
import tomllib

from IPython.core.inputtransformer2 import TransformerManager
from packaging.specifiers import SpecifierSet
from test_docs import section

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The repository's one address; every badge and install line below is made from it.
REPOSITORY = PROJECT["urls"]["Repository"]
OWNER_NAME = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)", REPOSITORY).group(1)
INSTALL = f'"xlakit @ git+{REPOSITORY}"'
# where each badge's link points, inside this repository on the default branch
LINKS = [rf"colab\.research\.google\.com/github/{re.escape(OWNER_NAME)}/blob/main/([^)\s]+)",
         rf"mybinder\.org/v2/gh/{re.escape(OWNER_NAME)}/main\?urlpath=lab/tree/([^)\s]+)"]
# Every notebook's install cell, exactly: the one install story on Colab and a fresh machine. It
# carries the cell tag "nbval-skip" (CI installed xlakit with `make`), not a comment a reader sees.
INSTALL_CELL = f"""# On Colab or a fresh machine: xlakit from its
# repository; a wheel that `make dist` built installs the same way (%pip install xlakit-*.whl). On a
# Colab TPU runtime as it comes, this upgrades none of torch, torch_xla, jax, libtpu or ipywidgets.
# For a bug report: xlakit.info() prints the versions, devices and cache it asks for.
import importlib.util
if importlib.util.find_spec("xlakit") is None:
    %pip install {INSTALL}"""


def tracked_files() -> set[str]:
    return set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.split())


def test_every_colab_and_binder_link_points_at_a_tracked_file():
    texts = [(ROOT / "README.md").read_text()] + [p.read_text() for p in NOTEBOOKS]
    targets = {m for text in texts for pattern in LINKS for m in re.findall(pattern, text)}
    assert {f"notebooks/{p.name}" for p in NOTEBOOKS} <= targets  # every notebook has its Colab badge
    assert targets <= tracked_files()


def test_every_link_into_the_repository_uses_pyprojects_address():
    texts = [(ROOT / "README.md").read_text(), *(p.read_text() for p in (ROOT / "docs").glob("*.md")),
             *(p.read_text() for p in NOTEBOOKS)]
    named = {m for text in texts for m in re.findall(r"(?:github\.com|github|/gh)/([\w.-]+/xlakit)\b", text)}
    assert named <= {OWNER_NAME}


def test_each_notebook_installs_xlakit_with_the_one_install_cell():
    assert "-U" not in INSTALL_CELL and "--upgrade" not in INSTALL_CELL  # Colab's torch, jax and libtpu stay
    compile(TransformerManager().transform_cell(INSTALL_CELL), "install cell", "exec")  # valid IPython
    for path in NOTEBOOKS:
        cells = [c for c in json.loads(path.read_text())["cells"]
                 if c["cell_type"] == "code" and "%pip install" in "".join(c["source"])]
        assert len(cells) == 1, path.name
        assert "".join(cells[0]["source"]) == INSTALL_CELL, path.name
        assert "nbval-skip" in cells[0]["metadata"].get("tags", []), path.name


def test_the_readme_and_the_colab_page_install_from_the_repository():
    install = section(ROOT / "README.md", "Install")
    assert f"\npip install {INSTALL}" in install and f"%pip install {INSTALL}" in install
    assert f"%pip install {INSTALL}" in section(ROOT / "docs" / "versions.md", "On a Colab TPU")
    assert "python -m xlakit info" in section(ROOT / "README.md", "Report a bug")


def test_pyproject_admits_the_tested_versions_and_no_torchax():
    dependencies = " ".join(PROJECT["dependencies"])
    assert "torchax" not in dependencies  # it does not import on torch 2.13
    for name, tested in [("torch", ["2.9.0", "2.13.0", "2.14.1"]), ("jax", ["0.7.2", "0.10.2"]),
                         ("ipywidgets", ["7.7.1", "8.1.7"])]:
        spec = next(d for d in PROJECT["dependencies"] if re.match(rf"{name}\b", d))
        for version in tested:
            assert version in SpecifierSet(spec.removeprefix(name)), (spec, version)
