"""What the tutorials' text quotes from their outputs is what those outputs say.

The convention: a markdown line that quotes an output is a blockquote of one code span,
"> `15 steps: 14 cache hits`", and the quote must appear in the stored output of a cell
tagged "nbval-check-output". nbval (`make test`) reruns each notebook and fails when such
a cell's fresh output differs from the stored one; this test fails when the text quotes
something no checked output says. Together: a quote cannot go stale.
"""
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
QUOTE = re.compile(r"^> `([^`]+)`\s*$", re.M)


def checked_outputs(cells: list[dict]) -> str:
    """The text of every output of the cells nbval compares with a fresh run."""
    texts = []
    for cell in cells:
        if cell["cell_type"] != "code" or "nbval-check-output" not in cell["metadata"].get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if output["output_type"] == "stream":
                texts.append("".join(output["text"]))
            elif output["output_type"] == "error":
                texts.append(f"{output['ename']}: {output['evalue']}")
            else:
                texts.append("".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


def quotes(cells: list[dict]) -> list[str]:
    return [quote for cell in cells if cell["cell_type"] == "markdown"
            for quote in QUOTE.findall("".join(cell["source"]))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_quoted_output_is_in_a_checked_output(path):
    cells = json.loads(path.read_text())["cells"]
    outputs = checked_outputs(cells)
    assert [quote for quote in quotes(cells) if quote not in outputs] == []


def test_the_quickstart_and_the_sharp_bits_quote_their_outputs():
    # the convention is in use where the text leans on outputs most
    for name in ("01_quickstart.ipynb", "02_sharp_bits.ipynb"):
        assert len(quotes(json.loads((ROOT / "notebooks" / name).read_text())["cells"])) >= 2, name


def test_a_stale_quote_is_caught():
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["> `15 steps: 14 cache hits`\n"]},
             {"cell_type": "code", "metadata": {"tags": ["nbval-check-output"]},
              "outputs": [{"output_type": "stream", "name": "stdout", "text": ["16 steps: 15 cache hits\n"]}]}]
    assert quotes(cells) == ["15 steps: 14 cache hits"]
    assert quotes(cells)[0] not in checked_outputs(cells)
    cells[1]["metadata"] = {}  # the same output in a cell nbval does not compare does not count
    cells[1]["outputs"][0]["text"] = ["15 steps: 14 cache hits\n"]
    assert checked_outputs(cells) == ""


def test_the_quickstarts_stored_key_is_the_one_the_code_computes_now(dev):
    """nbval hides digests (sanitize.cfg), so a re-keying change left every stored key of 01 stale.
    Its first step, computed again: the key components that depend on neither the machine nor the
    environment must be the stored ones (backend and flags do: tests run under conftest's XLA_FLAGS)."""
    import torch

    import xlakit

    cells = json.loads((ROOT / "notebooks" / "01_quickstart.ipynb").read_text())["cells"]
    texts = ["".join(output.get("data", {}).get("text/plain", "")) for cell in cells
             for output in cell.get("outputs", [])]
    text = next(t for t in texts if "step 0 [tiny]" in t)
    stored = dict(re.findall(r"^ {4}(\w+) +([0-9a-f]{16})$", text, re.M))
    a = torch.tensor([-1.0, 2.0, 3.0]).to(dev)
    y = (a * 2 + 1).relu().sum()
    xlakit.mark_step()
    step = xlakit.last_step()
    now = {name: digest[:16] for name, digest in step.components.items()}
    portable = ("graph", "inputs", "donors", "shardings")
    assert {n: now[n] for n in portable} == {n: stored[n] for n in portable}
    del y
