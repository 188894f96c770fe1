"""XLAKIT_CACHE_DIR: xlakit keeps its files in a private directory of its own inside it and
leaves the directory itself as it was (it may be /tmp, $HOME or a team's shared cache)."""
import os
import shutil
import stat
from pathlib import Path

import torch

import xlakit
from xlakit.engine import cache

PROGRAM = """
import torch, xlakit
y = (torch.arange(5.0).to(xlakit.device()) * 7).cos().sum()
xlakit.mark_step()
print(xlakit.last_step().cache, round(y.item(), 4))
"""


def _run(new_python, cache_dir, program=PROGRAM) -> list[str]:
    done = new_python("-c", program, env={**os.environ, "XLAKIT_CACHE_DIR": str(cache_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_a_shared_cache_dir_keeps_its_mode_and_the_cache_works_across_processes(new_python, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp
    eager = str(round((torch.arange(5.0) * 7).cos().sum().item(), 4))
    assert _run(new_python, shared) == ["miss", eager]
    assert _run(new_python, shared) == ["persistent_hit", eager]
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    private = cache.private_dir(str(shared))
    assert private.parent == shared and stat.S_IMODE(private.stat().st_mode) == 0o700
    assert list((private / "xlakit-executables").glob("*.pickle"))
    assert [p.name for p in shared.iterdir()] == [private.name]  # nothing of xlakit's outside it


def test_a_new_cache_dir_is_created_as_any_directory(new_python, tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    new = tmp_path / "new" / "cache"
    _run(new_python, new)
    assert stat.S_IMODE(new.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(cache.private_dir(str(new)).stat().st_mode) == 0o700


RELU_PROGRAM = """
import sys
sys.path.insert(0, {root!r})
import torch, xlakit
y = torch.tensor([-1.0, 2.0]).to(xlakit.device()).relu()
xlakit.mark_step()
print(xlakit.last_step().cache, *y.cpu().tolist())
"""


def test_an_executable_stored_by_other_lowering_code_is_not_loaded(new_python, tmp_path):
    """The key holds the lowering code by content: after relu's lowering changes (an editable
    install, a fix without a release), the stored executable of the old one is not served."""
    root = tmp_path / "src"
    shutil.copytree(Path(xlakit.__file__).parent, root / "xlakit", ignore=shutil.ignore_patterns("__pycache__"))
    program = RELU_PROGRAM.format(root=str(root))
    assert _run(new_python, tmp_path / "cache", program) == ["miss", "0.0", "2.0"]
    assert _run(new_python, tmp_path / "cache", program) == ["persistent_hit", "0.0", "2.0"]
    lowering = root / "xlakit" / "lowerings" / "activations.py"
    source = lowering.read_text()
    changed = source.replace("return jnp.maximum(self, jnp.zeros_like(self))", "return jnp.maximum(self, 1.0)")
    assert changed != source
    lowering.write_text(changed)
    assert _run(new_python, tmp_path / "cache", program) == ["miss", "1.0", "2.0"]



def test_the_cache_dir_set_again_in_a_running_process_is_followed(dev, tmp_path):
    """JAX decides once a process whether it uses its disk cache, and where: set again, xlakit's
    executables and JAX's own entries both follow the new setting (tests/conftest.py's no_disk_cache
    relies on it)."""
    from xlakit.config import default_cache_dir

    def outcome():
        xlakit.clear_cache()  # the in-memory executables: the disk decides
        (torch.arange(9.0).to(dev) * 5 - 2).cos().cpu()
        return xlakit.last_step().cache

    dirs = [tmp_path / "a", tmp_path / "b"]
    try:
        for where in dirs:
            cache.enable_persistent_cache(str(where))
            assert [outcome(), outcome()] == ["miss", "persistent_hit"]
            assert list(cache.private_dir(str(where)).glob("*-cache"))  # JAX's entry, here
        cache.enable_persistent_cache(None)
        assert outcome() == "miss"  # though both directories hold the program
        for pickle in (cache.private_dir(str(dirs[0])) / "xlakit-executables").glob("*.pickle"):
            pickle.unlink()
        cache.enable_persistent_cache(str(dirs[0]))
        assert outcome() == "persistent_hit"  # JAX's entry alone
    finally:
        cache.enable_persistent_cache(default_cache_dir())
