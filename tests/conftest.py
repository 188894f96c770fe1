import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# A private persistent cache per test session, so tests never see another run's executables; made
# by the process that starts the session (pytest-xdist's workers inherit it) and removed when it exits
# (each run left its cache, and each worker an empty one, in the temporary directory).
if "XLAKIT_CACHE_DIR" not in os.environ:
    os.environ["XLAKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="xlakit-test-cache-")
    atexit.register(shutil.rmtree, os.environ["XLAKIT_CACHE_DIR"], ignore_errors=True)

# The suite's compiles skip LLVM's optimization of XLA:CPU's kernels: the optimized HLO that xlakit
# reads (fusions, layouts, buffer assignment, donation) is byte-for-byte the same, and a small
# Llama's training step compiles in 0.9 s instead of 2.5 s. Set before JAX or torch_xla start (each
# reads XLA_FLAGS once); the processes a test starts inherit it, and xlakit's key and JAX's cache
# key read it, so no executable crosses between the two settings. The notebooks' kernels do not
# get it (pytest_runtest_setup below): they compile and profile as a user's kernel does (under it,
# notebooks/05's profile check failed on jax 0.7.2).
# --xla_cpu_enable_fast_math=false is XLA's default, and the flag that importing torch_xla appends
# where it is not set: stated here, every column's flags are the same whether torch_xla is installed
# or not, and so is JAX's cache key (it hashes XLA_FLAGS), so the latest column loads from CI's
# shared disk cache what `make test` compiled where torch 2.13 lowered the same program (a small
# Llama's training step: 2.7 s compiled, 0.34 s loaded).
USER_XLA_FLAGS = os.environ.get("XLA_FLAGS")
SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_enable_fast_math=false"
os.environ["XLA_FLAGS"] = f"{SUITE_XLA_FLAGS} {USER_XLA_FLAGS or ''}".strip()

os.environ.setdefault("PJRT_DEVICE", "CPU")

import pytest  # noqa: E402


def pytest_configure(config):
    """torch_xla, where installed, creates its device before the first backward() of the process
    (autograd sizes its device queues once). Not in pytest-xdist's controller, which runs no test:
    its workers start without waiting for it to import torch, torch_xla and jax (~5 s)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    try:
        import torch_xla
    except ImportError:
        return
    torch_xla.device()


# The Makefile's TESTS run tests/ and the notebooks on two pytest-xdist workers, dealt out in
# the units below. tests/ is two stretches of the serial order, each one worker's from its start:
# the files before SECOND_STRETCH, and the rest, split where a run's measured time halves (in
# `make test`, the first holds the benchmark and browser tests, which run in processes of their
# own; the Makefile gives each other column, with fewer modules, its own split). Dealt out
# module by module as workers freed up (--dist loadscope), a module met what no serial run leaves
# it: once, in the Colab column, a tensor an earlier module left half-freed broke every later sync.
# Each notebook is a unit of its own, its cells in order in one kernel; a worker done with its
# stretch takes the next, so the notebooks even out what the split leaves uneven.
SECOND_STRETCH = os.environ.get("XLAKIT_SECOND_STRETCH", "tests/test_graph_breaks.py")


def unit_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        return path
    return "second stretch" if path >= SECOND_STRETCH else "first stretch"


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config, log):
    # Written here because `--dist loadgroup` no longer groups: pytest 9 ignores the `_nodeid`
    # that xdist 3.8 rewrites to name an item's group, and dealt out every test alone.
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        """Whole units, the largest first (the stretches), each to the next free worker."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return Units(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A notebook's kernel starts (nbval, in its first cell's setup) with the caller's XLA_FLAGS."""
    if not item.nodeid.split("::")[0].endswith(".ipynb"):
        return (yield)
    suite_flags = os.environ.pop("XLA_FLAGS")
    if USER_XLA_FLAGS is not None:
        os.environ["XLA_FLAGS"] = USER_XLA_FLAGS
    try:
        return (yield)
    finally:
        os.environ["XLA_FLAGS"] = suite_flags


@pytest.fixture
def no_disk_cache():
    """For a test that counts compiles: the disk cache off while it runs, so no executable that
    another run stored loads instead of a compile (CI's columns share one cache dir, and with the
    same jax a program compiled in one loads in the next; so would a developer's XLAKIT_CACHE_DIR)."""
    from xlakit.config import default_cache_dir
    from xlakit.engine import cache

    cache.enable_persistent_cache(None)
    yield
    cache.enable_persistent_cache(default_cache_dir())


@pytest.fixture(scope="module")
def shell():
    """A real IPython shell with xlakit's magics loaded (the notebook tests drive it)."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext xlakit", store_history=True)
    ip.run_cell("import torch, xlakit\ndev = xlakit.device()", store_history=True)
    return ip


@pytest.fixture(scope="session")
def new_python():
    """new_python(*argv, env=None, timeout=None, check=False) runs `python *argv` (`-c PROGRAM` or a
    script and its arguments) in a new process, as subprocess.run(..., capture_output=True, text=True) does.
    The process is forked from tests/zygote.py, which imported torch and jax once: each program
    starts without their import, and with nothing another program left."""
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py"))], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(*argv: str, env=None, timeout=None, check=False) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as readers:
            # pipes, as subprocess gives: a file would fall under the program's own limits (RLIMIT_FSIZE)
            pipes = [Path(tmp, name) for name in ("stdout", "stderr")]
            for pipe in pipes:
                os.mkfifo(pipe)
            server.stdin.write(json.dumps({"argv": argv, "env": dict(os.environ if env is None else env),
                                           "cwd": os.getcwd(), "stdout": str(pipes[0]), "stderr": str(pipes[1]),
                                           "timeout": timeout}) + "\n")
            server.stdin.flush()
            out, err = readers.map(Path.read_text, pipes)
            status = server.stdout.readline()
        assert status, f"tests/zygote.py ended: {server.stderr.read()[-3000:]}"
        done = subprocess.CompletedProcess([sys.executable, *argv], int(status), out, err)
        if check:
            done.check_returncode()
        return done

    yield run
    server.stdin.close()
    server.wait()


# Tests of the lowerings against eager: a Python read of integer ops on uploads is answered on
# the host by eager torch (front/host_reads.py), which would compare eager with eager; here the
# device computes every value read.
_LOWERING_TESTS = ("test_lowerings_", "test_ops", "test_opinfo", "test_op_regressions", "test_dtypes",
                   "test_differential", "test_grouped_mm", "test_overlapping_writes", "test_view_strides")


@pytest.fixture(autouse=True)
def _device_answers_reads_in_lowering_tests(request, monkeypatch):
    if request.module.__name__.split(".")[-1].startswith(_LOWERING_TESTS):
        from xlakit.config import config

        monkeypatch.setattr(config, "host_copy_bytes", 0)


@pytest.fixture
def dev():
    import xlakit

    xlakit.mark_step()
    xlakit.reset_metrics()
    return xlakit.device()


def assert_same(lazy, eager, **tol):
    """Values, dtype and shape of a lazy tensor equal eager torch's."""
    import torch

    host = lazy.cpu()
    assert host.dtype == eager.dtype, (host.dtype, eager.dtype)
    assert host.shape == eager.shape, (host.shape, eager.shape)
    torch.testing.assert_close(host, eager, **tol)
