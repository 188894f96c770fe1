"""The refactor safety net (issue #46, in the spirit of tinygrad's process replay): a fixed set
of programs (tests/net/net_programs.py) whose steps, key components, donors and optimized HLO
are stored in tests/net/expected/; each is run again here and diffed against what is stored.

What is compared where (tests/net/store.py says why):
- the steps (trigger, cache outcome, key components but `backend`, donors): in every column,
  against the files of its torch release (torch 2.9: the README's column and Colab's; 2.13);
- the optimized HLO: in `make test`'s column only (torch 2.9, jax 0.10.2), skipped elsewhere;
- the keys: where the backend (python, jax, jaxlib, torch, xlakit versions) is the one that
  made them, skipped elsewhere: the key digests the backend too.

Two fresh processes (one device, and eight for the sharded step) run every program. CI time,
measured 2026-12-01 on two cores shared with other work (load 3.6): 22-25 s .venv, 26 s
.venv-latest, 22 s .venv-colab; the Llama's two compiles and transformers' import are 7 s of it.
"""
import difflib
import json

import pytest

from net import net_programs, snapshot, store

MOVED = f"a change that moves these says why in its commit; regenerate with: {store.REGENERATE}"


@pytest.fixture(scope="module")
def taken(new_python):
    return snapshot.take(new_python)


def _assert_same(path, actual: str) -> None:
    expected = path.read_text() if path.exists() else ""
    if actual == expected:
        return
    diff = list(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                     fromfile=f"{path} (stored)", tofile="this run"))
    shown = "".join(diff[:200]) + (f"... {len(diff) - 200} more diff lines\n" if len(diff) > 200 else "")
    pytest.fail(f"{path.name} moved: {MOVED}\n{shown}", pytrace=False)


@pytest.mark.parametrize("program", sorted(net_programs.PROGRAMS))
def test_steps(taken, program):
    backend, snapshots = taken
    folder = store.steps_dir(backend)
    if not folder.exists():
        pytest.skip(f"nothing stored for torch {store.torch_minor(backend)}: {store.REGENERATE} stores it")
    _assert_same(folder / f"{program}.json", store.steps_text(snapshots[program]))


@pytest.mark.parametrize("program", sorted(net_programs.PROGRAMS))
def test_hlo(taken, program):
    backend, snapshots = taken
    if not store.stores_hlo(backend):
        pytest.skip("the HLO is stored for torch {}, jax {} only: it moves with both".format(*store.HLO_COLUMN))
    _assert_same(store.hlo_dir() / f"{program}.hlo", store.hlo_text(snapshots[program]))


def test_keys(taken):
    backend, snapshots = taken
    path = store.hlo_dir() / "keys.json"
    made_under = json.loads(path.read_text())["backend"]
    if made_under != backend:
        pytest.skip(f"the keys were made under {made_under}, this is {backend}: the key digests the backend")
    _assert_same(path, store.keys_text(backend, snapshots))
