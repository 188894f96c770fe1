"""What the README and docs/ say where the code can contradict it: the key's components,
the layers and folders, the record's enums, the install list, the tested versions,
the OpInfo counts, the README's first screen, and every relative link and path."""
import ast
import json
import pathlib
import re

from test_architecture import FOLDERS, LAYERS, PACKAGE

from xlakit.core.record import Cache, Trigger
from xlakit.engine.keys import COMPONENTS

ROOT = PACKAGE.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FENCED = re.compile(r"^```.*?^```", re.S | re.M)


def section(path: pathlib.Path, title: str) -> str:
    """The text under the heading `title`, up to the next heading of its level or above."""
    text = path.read_text()
    heading = re.search(rf"^(#+) {re.escape(title)}\n", text, re.M)
    assert heading, f"{path.name} has no section {title!r}"
    end = re.compile(rf"^#{{1,{len(heading.group(1))}}} ", re.M).search(text, heading.end())
    return text[heading.end():end.start() if end else len(text)]


def listed(text: str, name: str) -> list[str]:
    """The backticked words in "`name` (`a`, `b`, ...)"."""
    found = re.search(rf"`{name}` \(([^)]*)\)", text)
    assert found, name
    return re.findall(r"`(\w+)`", found.group(1))


def table(text: str) -> list[list[str]]:
    """The rows of the first markdown table in `text`, header first, without the rule."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows if not set("".join(row)) <= set("-: ")]


def test_the_key_components_are_the_keys():
    rows = table(section(DOCS / "architecture.md", "The key"))[1:]
    assert tuple(re.fullmatch(r"`(\w+)`", row[0]).group(1) for row in rows) == COMPONENTS
    assert tuple(listed(README.read_text(), "components")) == COMPONENTS


def test_the_records_triggers_and_cache_outcomes_are_the_enums():
    text = README.read_text()
    assert listed(text, "trigger") == [t.value for t in Trigger]
    assert listed(text, "cache") == [c.value for c in Cache]


def test_the_folder_tree_is_the_layers_and_the_folders():
    tree = next(block for block in FENCED.findall((DOCS / "architecture.md").read_text())
                if block.split("\n")[1] == "xlakit/")
    entries = [re.match(r" {2}(\S.*?)(?: {2,}|$)", line).group(1).split(", ")
               for line in tree.splitlines() if re.match(r" {2}\S", line)]
    assert [{name.removesuffix("/").removesuffix(".py") for name in entry} for entry in entries] == LAYERS
    names = [name for entry in entries for name in entry]
    assert sorted(n.removesuffix("/") for n in names if n.endswith("/")) == FOLDERS
    assert sorted(n for n in names if n.endswith(".py")) == sorted(p.name for p in PACKAGE.glob("*.py"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _notebook_anchors(path: pathlib.Path) -> set[str]:
    """Jupyter's anchor for each heading of a notebook: its text, spaces as dashes."""
    return {heading.strip().replace(" ", "-") for cell in json.loads(path.read_text())["cells"]
            if cell["cell_type"] == "markdown" for heading in re.findall(r"^#+ (.*)$", "".join(cell["source"]), re.M)}


def _markdown() -> list[tuple[pathlib.Path, str]]:
    """(file, markdown) of every page and every notebook's markdown cells, code blocks left out."""
    found = [(page, page.read_text()) for page in PAGES]
    found += [(path, "".join(cell["source"])) for path in NOTEBOOKS
              for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "markdown"]
    return [(path, FENCED.sub("", text)) for path, text in found]


def test_every_relative_link_points_at_a_file_that_exists():
    broken = []
    for path, text in _markdown():
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in link:
                continue
            target, _, anchor = link.partition("#")
            target = (path.parent / target).resolve() if target else path
            if not target.exists():
                broken.append(f"{path.name}: {link}")
            elif anchor and target.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
                if anchor not in map(_slug, headings):
                    broken.append(f"{path.name}: {link} (no such heading)")
            elif anchor and target.suffix == ".ipynb" and anchor not in _notebook_anchors(target):
                broken.append(f"{path.name}: {link} (no such heading)")
    assert broken == []


def test_every_path_the_docs_name_exists():
    """`core/ir.py`, `xlakit/lowerings/verdicts.py`, `tests/test_stages.py`, ...: files move."""
    units = "|".join(FOLDERS)
    missing = []
    for path, text in _markdown():
        for name in re.findall(rf"`((?:xlakit/)?(?:{units})/[\w/.]+|(?:tests|bench|scripts|docs)/[\w/.]+)`", text):
            if not ((ROOT / name).exists() or (PACKAGE / name).exists()):
                missing.append(f"{path.name}: {name}")
    assert missing == []


def test_the_first_screen_has_install_the_make_commands_and_every_notebook():
    first = "\n".join(README.read_text().splitlines()[:60])
    assert "%pip install" in first and re.search(r"!\[[^]]*\]\(docs/\w+\.png\)", first)
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab", "test"):
        assert f"make {target}" in first and re.search(rf"^{target}:", makefile, re.M), target
    assert [p.name for p in NOTEBOOKS] == re.findall(r"\]\(notebooks/(\w+\.ipynb)\)", first)


def _filtered_messages(path: pathlib.Path) -> list[str]:
    """The messages a module filters out of warnings (xlakit filters only when it installs), unescaped."""
    return [re.sub(r"\\(.)", r"\1", keyword.value.value) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "warnings.filterwarnings"
            for keyword in node.keywords if keyword.arg == "message"]


def test_the_install_list_names_each_change_and_its_module():
    """docs/process.md names each module install() calls, the JAX settings it makes and
    every warning the installed modules filter out."""
    page = (DOCS / "process.md").read_text()
    install = PACKAGE / "front" / "install.py"
    tree = ast.parse(install.read_text())
    modules = {alias.asname or alias.name: f"{'front' if node.level == 1 else node.module}/{alias.name}.py"
               for node in tree.body if isinstance(node, ast.ImportFrom) and node.level
               for alias in node.names}
    (function,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "install"]
    calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
    called = {modules[node.func.value.id] for node in calls
              if isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", None) in modules}
    assert called and sorted(m for m in called if f"`{m}`" not in page) == []
    settings = [node.args[0].value for node in calls if ast.unparse(node.func) == "jax.config.update"]
    assert settings and [s for s in settings if f"`{s}`" not in page] == []
    messages = [m for path in [install, *(PACKAGE / m for m in sorted(called))] for m in _filtered_messages(path)]
    assert messages and [m for m in messages if m not in " ".join(page.split())] == []


def test_the_tested_versions_are_each_columns_pins():
    rows = table(section(DOCS / "versions.md", "Tested versions"))
    makefile = (ROOT / "Makefile").read_text()
    for column, header in enumerate(rows[0][1:], 1):
        venv = re.search(r"\((\.venv[\w-]*)\)", header).group(1)
        stack = re.search(rf"^{re.escape(venv)}/\.installed: STACK := (\S+)", makefile, re.M).group(1)
        pins = dict(re.findall(r"^([\w-]+)==(\S+)", (ROOT / stack).read_text(), re.M))
        for row in rows[1:]:
            package = row[0].split(",")[0]
            if package in ("torch", "torch_xla", "jax"):
                assert row[column].split()[0] == pins.get(package, "—"), (stack, package)


def test_the_opinfo_counts_are_the_sweeps():
    sweep = dict((kind, int(n)) for n, kind in
                 re.findall(r"(\d+) (pass|fallback|error|mismatch)\b", (DOCS / "op_coverage.md").read_text())[:4])
    stated = re.search(r"(\d+) pass, (\d+) fall back, (\d+) are clear errors \([^)]*\), none mismatch",
                       " ".join((DOCS / "correctness.md").read_text().split()))
    assert stated and sweep == {"pass": int(stated[1]), "fallback": int(stated[2]), "error": int(stated[3]),
                                "mismatch": 0}
