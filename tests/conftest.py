import os
import tempfile

# A private persistent cache per test session, so tests never see another run's executables.
os.environ.setdefault("XLAKIT_CACHE_DIR", tempfile.mkdtemp(prefix="xlakit-test-cache-"))

# torch_xla, where installed, must create its device before the first backward()
# of the process (autograd sizes its device queues once).
os.environ.setdefault("PJRT_DEVICE", "CPU")
try:
    import torch_xla

    torch_xla.device()
except ImportError:
    torch_xla = None

import pytest  # noqa: E402
import torch  # noqa: E402

import xlakit  # noqa: E402


@pytest.fixture(scope="module")
def shell():
    """A real IPython shell with xlakit's magics loaded (the notebook tests drive it)."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext xlakit", store_history=True)
    ip.run_cell("import torch, xlakit\ndev = xlakit.device()", store_history=True)
    return ip


@pytest.fixture
def dev():
    xlakit.mark_step()
    xlakit.reset_metrics()
    return xlakit.device()


def assert_same(lazy: torch.Tensor, eager: torch.Tensor, **tol):
    """Values, dtype and shape of a lazy tensor equal eager torch's."""
    host = lazy.cpu()
    assert host.dtype == eager.dtype, (host.dtype, eager.dtype)
    assert host.shape == eager.shape, (host.shape, eager.shape)
    torch.testing.assert_close(host, eager, **tol)
