"""Keep the benchmark harness working: each script once, tiny. No timing is asserted."""
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_training_benchmark_runs_quick(new_python):
    done = new_python(str(BENCH / "training.py"), "--quick", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| xlakit lazy |" in done.stdout and "| jax.jit (donating) |" in done.stdout


def test_render_benchmark_runs_quick(new_python):
    done = new_python(str(BENCH / "render.py"), "--quick", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| static SVG (dot) |" in done.stdout and "| open (first draw) |" in done.stdout


def test_real_models_benchmark_runs_quick(new_python):
    done = new_python(str(BENCH / "real_models.py"), "--quick", timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| xlakit lazy |" in done.stdout and "| jax.jit (donating) |" in done.stdout
    assert "| second (same cache dir) |" in done.stdout


def test_moe_benchmark_runs_quick(new_python):
    done = new_python(str(BENCH / "moe.py"), "--quick", timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| jax.jit ragged_dot, the floor |" in done.stdout and "| xlakit lazy (grouped_mm) |" in done.stdout


def test_numerics_benchmark_runs_quick(new_python):
    done = new_python(str(BENCH / "numerics.py"), "--quick", timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| jax.jit + jax_debug_nans |" in done.stdout and "| check_nans |" in done.stdout
    assert "encountered in log" in done.stdout and "aten.log.default" in done.stdout
