"""Dynamo's graph-break reasons as Dynamo explains them: the break's type, its
code in Dynamo's graph-break registry (torch/_dynamo/graph_break_registry.json,
torch 2.9 and later), the explanation and the hints.

Most reasons are Dynamo's formatted message ("Dynamic shape operator\\n
Explanation: ...\\n  Hint: ..."), read here. A few are bare
("generic_jump TensorVariable()", torch 2.9 and 2.13): those take the type
Dynamo logs for them, and the explanation and hints its registry keeps for
that type. Where the installed torch has no registry, a reason keeps its own words.

The everyday breaks also get plain words (`plain`), what the user's code did in
terms they wrote it in ("an `if` on a tensor's value"); Dynamo's type, code,
explanation and what it saw stay beside them.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import re

import torch

# bare reasons -> the graph-break type Dynamo logs for them (symbolic_convert.generic_jump)
_BARE = {"generic_jump": "Data-dependent branching"}
_SECTIONS = {"Explanation:": "explanation", "Hint:": "hint", "Developer debug context:": "context"}
_MORE = "For more details about this graph break"
_QUOTED = re.compile(r"`([^`]+)`")
# graph-break type -> plain words; {name}: the first `quoted` name in Dynamo's explanation
_PLAIN = {
    "Data-dependent branching": "an `if` (or `while`) on a tensor's value: Python needs the value, so the graph "
                                "ends to compute it",
    "Failed to trace builtin operator": "a call of Python's `{name}`, which Dynamo cannot put in a graph: it runs "
                                        "in Python between two graphs",
    "Dynamic shape operator": "`{name}`'s output shape depends on the tensor's values, unknown until it runs",
    "Data dependent operator": "`{name}` returns a Python value computed from a tensor's values",
    "Unsupported Tensor.item() call with capture_scalar_outputs=False": "`.item()` reads a tensor's value into "
                                                                        "Python, so the graph ends to compute it",
}


@dataclasses.dataclass(frozen=True)
class DynamoReason:
    title: str                # the break's type ("Data-dependent branching"), else the reason's first line
    code: str                 # its registry code ("GB0170"); "" where the installed torch has none
    explanation: str
    hints: tuple[str, ...]
    context: str              # what Dynamo saw ("attempted to jump with TensorVariable()", "aten.nonzero.default")

    @property
    def dynamo_words(self) -> str:
        """Dynamo's name for it: 'Data-dependent branching (GB0170)'."""
        return f"{self.title} ({self.code})" if self.code else self.title

    @property
    def plain(self) -> str:
        """What the code did, in plain words; "" for a type without them."""
        template = _PLAIN.get(self.title, "")
        quoted = _QUOTED.search(self.explanation)
        if "{name}" in template and quoted is None:
            return ""
        return template.format(name=quoted.group(1) if quoted else "")

    def __str__(self) -> str:
        return f"{self.plain} (Dynamo: {self.dynamo_words})" if self.plain else self.dynamo_words


def explain(reason: str) -> DynamoReason:
    lines = reason.strip().splitlines() or [""]
    bare = _BARE.get(lines[0].split(" ", 1)[0])
    if bare is not None:
        entry = _entry(bare)
        return DynamoReason(bare, _codes().get(bare, ""), entry.get("Explanation", ""),
                            tuple(entry.get("Hints", ())), lines[0])
    fields = {"explanation": [], "hint": [], "context": []}
    section = None
    for line in lines[1:]:
        text = line.strip()
        head = next((h for h in _SECTIONS if text.startswith(h)), None)
        if head is not None:
            section = _SECTIONS[head]
            fields[section].append(text.removeprefix(head).strip())
        elif text.startswith(_MORE):
            section = None
        elif section is not None and text:  # a wrapped line goes on with the one above
            fields[section][-1] += " " + text
    return DynamoReason(lines[0], _codes().get(lines[0], ""), " ".join(fields["explanation"]),
                        tuple(fields["hint"]), " ".join(fields["context"]))


@functools.cache
def _registry() -> dict[str, list[dict]]:
    """Dynamo's registry of graph breaks: code -> its entries (type, context, explanation, hints)."""
    path = pathlib.Path(torch._dynamo.__file__).parent / "graph_break_registry.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # a torch without one, or a damaged file: reasons keep their own words
        return {}


@functools.cache
def _codes() -> dict[str, str]:
    """Graph-break type -> its code (the first, where a type was renumbered)."""
    codes: dict[str, str] = {}
    for code, entries in _registry().items():
        for entry in entries:
            codes.setdefault(entry.get("Gb_type", ""), code)
    return codes


_NOT_PROSE = re.compile(r"^[\w.]*$|^[f]?[\"']")  # a variable's name or a quoted expression the registry kept


def _entry(gb_type: str) -> dict:
    """The registry's explanation and hints for a type: its entries' first prose
    explanation and first non-empty hints (some entries keep the source's variable
    names, "_explanation", instead of the text)."""
    entries = _registry().get(_codes().get(gb_type, ""), [])
    explanation = next((e["Explanation"] for e in entries if not _NOT_PROSE.match(e.get("Explanation", ""))), "")
    hints = next((e["Hints"] for e in entries if e.get("Hints")), [])
    return {"Explanation": explanation, "Hints": hints}
