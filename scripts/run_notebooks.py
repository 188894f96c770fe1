"""Execute the tutorials and store them with their outputs, as a reader sees them.

`python scripts/run_notebooks.py [notebooks/01_quickstart.ipynb ...]` (default:
all of notebooks/). Run from the repository root with the venv whose outputs
should be stored (.venv: torch_xla's tutorial needs it). Each runs in a fresh
kernel with an empty compilation cache, so the first step of each graph reads
"compiled". No widget state is stored: a static page (GitHub, nbviewer,
nbconvert) then shows each output's HTML instead of an empty widget box.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(path: pathlib.Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["XLAKIT_CACHE_DIR"] = cache
        NotebookClient(notebook, timeout=1200, kernel_name="python3", store_widget_state=False,
                       record_timing=False, resources={"metadata": {"path": str(path.parent)}}).execute()
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    print(f"{path.relative_to(ROOT)}: executed and stored")


if __name__ == "__main__":
    paths = [pathlib.Path(p).resolve() for p in sys.argv[1:]] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for notebook_path in paths:
        run(notebook_path)
