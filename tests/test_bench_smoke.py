"""Keep the benchmark harness working: each script once, tiny. No timing is asserted."""
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


# script, its timeout, what its output must hold
BENCHMARKS = {
    "training": (600, ["| xlakit lazy |", "| jax.jit (donating) |", "### Recompiles:", "### Memory of the AdamW step",
                       "### In-graph checks"]),
    "render": (600, ["| static SVG (dot) |", "| open (first draw) |", "| static groups (details) |"]),
    "real_models": (900, ["| xlakit lazy |", "| jax.jit (donating) |", "| second (same cache dir) |",
                          "| xlakit torch.compile, whole step |"]),
    "moe": (900, ["| jax.jit ragged_dot, the floor |", "| xlakit lazy (grouped_mm) |"]),
    "mask_reads": (600, ["| GPT-2 | on |", "| Llama | off |", "| 64 x 2048 int64 | on |"]),
    "dispatch_ahead": (600, ["| xlakit lazy |", "| xlakit torch.compile, whole step |"]),
    "numerics": (900, ["| jax.jit + jax_debug_nans |", "| check_nans |", "encountered in log", "aten.log.default"]),
}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_runs_quick(new_python, name):
    """Over 20 s: a benchmark script with every peer it compares, each compiling its steps (real_models:
    ~55 s on one core of a busy machine, its cold start three new processes)."""
    timeout, expected = BENCHMARKS[name]
    done = new_python(str(BENCH / f"{name}.py"), "--quick", timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    missing = [text for text in expected if text not in done.stdout]
    assert not missing, (missing, done.stdout[-2000:])
