"""The shape of the code: imports run one way (docs/architecture.md), with no loops, and
importing xlakit changes nothing global in torch or JAX."""
import ast
import pathlib
import re
import subprocess
import sys
import textwrap

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "xlakit"

# The folders and top-level modules, lowest first: data flows one way, torch ops -> IR
# -> key -> cache -> executable -> StepRecord -> views. A unit imports only units below
# it; each folder's __init__ docstring says which ("Imports: ..."), and this checks it.
LAYERS = [
    {"config", "version"},
    {"core"},
    {"lowerings"},
    {"analysis"},
    {"engine"},
    {"front"},
    {"session"},
    {"integrations"},
    {"notebook"},
    {"environment"},
    {"__init__", "__main__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
FOLDERS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())


def module_of(path: pathlib.Path) -> str:
    """'engine.keys', 'lowerings' (a folder's __init__), '__init__' (the package's)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_of(p): p for p in PACKAGE.rglob("*.py")}


def unit(module: str) -> str:
    return module.split(".")[0]


def imported(path: pathlib.Path) -> set[str]:
    """xlakit modules that `path` imports, at the top or inside functions."""
    found = set()
    module = module_of(path)
    package = module.split(".") if path.name == "__init__.py" and module != "__init__" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module or "").startswith("xlakit"):
                    continue
                base = node.module.split(".")[1:]
            else:
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                sub = ".".join(base + [alias.name])
                found.add(sub if sub in MODULES else ".".join(base) or "__init__")
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("xlakit.") for a in node.names if a.name.startswith("xlakit."))
    return found - {module}


def stated_imports(folder: str) -> set[str]:
    """The units a folder's docstring says it may import ("Imports: core, lowerings.")."""
    doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
    line = re.search(r"^Imports: ([\w, ]+)\.", doc, re.MULTILINE)
    assert line, f"{folder}/__init__.py: its docstring says what it owns and ends with 'Imports: ...'"
    return {name.strip() for name in line.group(1).split(",")}


def test_every_module_has_a_layer():
    assert {unit(m) for m in MODULES} <= set(RANK), {unit(m) for m in MODULES} - set(RANK)


def test_no_import_runs_back_up_the_layers():
    upward = [f"{m} imports {target}" for m, path in sorted(MODULES.items()) for target in imported(path)
              if unit(target) != unit(m) and RANK[unit(target)] >= RANK[unit(m)]]
    assert upward == []


def test_each_folder_imports_what_its_docstring_says():
    for folder in FOLDERS:
        allowed = stated_imports(folder) | {folder, "config", "version"}
        assert all(RANK[name] < RANK[folder] for name in allowed - {folder}), folder
        beyond = sorted(f"{m} imports {t}" for m, p in MODULES.items() if unit(m) == folder
                        for t in imported(p) if unit(t) not in allowed)
        assert beyond == [], beyond


def test_no_import_loops_anywhere():
    """Inside folders too: a module never imports, directly or not, one that imports it."""
    edges = {m: imported(p) & set(MODULES) for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            assert state.get(target) != 1, " -> ".join(path + [module, target])
            if target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [])


def test_views_never_reach_into_the_engine():
    for module, path in MODULES.items():
        if unit(module) == "notebook":
            assert not {unit(t) for t in imported(path)} & {"engine", "front", "lowerings"}, module


def test_nothing_outside_the_engine_touches_its_parts():
    """The Engine's public methods are its surface: outside engine/, no module reaches a private
    part of it (its ledger, tape, tensors, asserts, lock, private methods), through current() or a
    name bound to it."""
    reach = re.compile(r"\b(?:current\(\)|engine)\._\w+")
    found = {f"{module}: {m.group()}" for module, path in MODULES.items() if unit(module) != "engine"
             for m in reach.finditer(path.read_text())}
    assert not found, sorted(found)


def test_import_changes_nothing_global_in_torch_or_jax():
    program = textwrap.dedent("""
        import jax, torch
        from jax._src import compilation_cache as cc
        from jax._src.interpreters import mlir

        def state():
            return (jax.config.jax_enable_x64, jax.config.jax_enable_compilation_cache,
                    cc.get_executable_and_time, cc.put_executable_and_time,
                    torch._C._get_privateuse1_backend_name(), torch.nn.Module._apply,
                    torch.nn.Module.load_state_dict, torch.amp.autocast.__enter__,
                    hasattr(torch, "lazy"), len(torch.nn.modules.module._global_parameter_registration_hooks),
                    getattr(mlir, "HashableLiteral", None) and mlir.HashableLiteral.__init__)  # jax 0.7

        before = state()
        import xlakit
        assert state() == before, (before, state())
        xlakit.device()
        after = state()
        assert after != before and after[0] is True, after
        xlakit.device()
        assert state() == after  # installing is idempotent
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "ok", result.stderr[-3000:]
