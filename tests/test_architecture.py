"""The shape of the code: imports run one way (shared/DESIGN.md), and importing
xlakit changes nothing global in torch or JAX."""
import ast
import pathlib
import subprocess
import sys
import textwrap

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "xlakit"

# Each module may import only modules of a lower layer (data flows one way:
# torch ops -> IR -> key -> cache -> executable -> StepRecord -> views).
LAYERS = [
    {"version", "config", "ir", "transfer", "ops", "checks", "scopes"},
    {"record", "sources", "lowerings"},
    {"sharding"},
    {"keys", "cache", "lowering", "analysis", "footprint"},
    {"stages", "eager", "verification", "flops"},
    {"engine"},
    {"tensor"},
    {"frontend"},
    {"functionalization", "labels", "device_module", "spmd", "serialization"},
    {"modules", "amp"},
    {"runtime"},
    {"api", "dynamo", "torch_xla"},
    {"breaks", "opinfo"},
    {"notebook"},
    {"__init__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0] if len(parts) > 1 else parts[0]


def imported(path: pathlib.Path, name: str) -> set[str]:
    """xlakit modules that `path` imports, at the top or inside functions."""
    found = set()
    package = path.relative_to(PACKAGE).parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("xlakit."):
                    found.add(node.module.split(".")[1])
                continue
            base = list(package[: len(package) - (node.level - 1)])
            target = base + (node.module.split(".") if node.module else [])
            if target:
                found.add(target[0])
            else:  # from . import a, b
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("xlakit."))
    return found - {name}


def test_every_module_has_a_layer():
    names = {module_name(p) for p in PACKAGE.rglob("*.py")}
    assert names <= set(RANK), names - set(RANK)


def test_no_import_runs_back_up_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for target in imported(path, name):
            if RANK[target] >= RANK[name] and not (name == "notebook" and target == "notebook"):
                upward.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert upward == []


def test_views_never_reach_into_the_engine():
    for path in (PACKAGE / "notebook").glob("*.py"):
        assert not imported(path, "notebook") & {"engine", "tensor", "frontend", "functionalization", "eager",
                                                 "ops", "lowering", "cache", "runtime"}, path


def test_import_changes_nothing_global_in_torch_or_jax():
    program = textwrap.dedent("""
        import jax, torch
        from jax._src import compilation_cache as cc

        def state():
            return (jax.config.jax_enable_x64, jax.config.jax_enable_compilation_cache,
                    cc.get_executable_and_time, cc.put_executable_and_time,
                    torch._C._get_privateuse1_backend_name(), torch.nn.Module._apply,
                    torch.nn.Module.load_state_dict, torch.amp.autocast.__enter__,
                    hasattr(torch, "lazy"), len(torch.nn.modules.module._global_forward_pre_hooks))

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
