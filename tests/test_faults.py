"""Faults: interrupted compiles, failing executions, bad cache directories."""
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import torch

import xlakit
from xlakit import lowering
from xlakit.engine import StepExecutionError, StepFailedError

PROGRAM = ("import torch, xlakit, warnings\nwarnings.simplefilter('always')\n"
           "x = torch.arange(5.0).to(xlakit.device())\ny = (x * 7).cos().sum()\nxlakit.mark_step()\n"
           "print(xlakit.last_step().cache, round(y.item(), 4))")


def _run(cache_dir: str):
    env = {**os.environ, "XLAKIT_CACHE_DIR": cache_dir}
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True)


def test_keyboard_interrupt_during_compile_leaves_the_engine_consistent(dev, monkeypatch):
    x = torch.arange(4.0).to(dev)
    xlakit.mark_step()
    y = x.exp() * 3

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lowering, "lower", interrupted)
    with pytest.raises(KeyboardInterrupt):
        xlakit.mark_step()
    monkeypatch.undo()
    xlakit.mark_step()  # the same pending work, now compiled
    torch.testing.assert_close(y.cpu(), torch.arange(4.0).exp() * 3)
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_failing_execution_is_a_clear_error_and_the_engine_goes_on(dev, monkeypatch):
    x = torch.ones(3).to(dev)
    xlakit.mark_step()
    y = x * 2

    def device_fault(*args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: injected")

    monkeypatch.setattr(jax, "block_until_ready", device_fault)
    with pytest.raises(StepExecutionError, match=r"could not run this step.*RESOURCE_EXHAUSTED.*12 bytes of outputs"):
        xlakit.mark_step()
    monkeypatch.undo()
    with pytest.raises(StepFailedError, match="RESOURCE_EXHAUSTED"):
        y.cpu()
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]      # inputs were not lost
    assert (x + 1).cpu().tolist() == [2.0, 2.0, 2.0]


def test_unusable_cache_dir_warns_and_compiles_without_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = _run(str(blocker / "cache"))
    assert done.returncode == 0, done.stderr
    assert "cannot use" in done.stderr and "compilation cache" in done.stderr
    assert done.stdout.split()[0] == "miss"


def test_corrupt_cache_entries_mean_a_recompile_not_a_crash(tmp_path):
    cache = tmp_path / "cache"
    first = _run(str(cache))
    assert first.returncode == 0 and first.stdout.split()[0] == "miss"
    entries = [p for p in Path(cache).rglob("*") if p.is_file()]
    assert entries
    for p in entries:
        p.write_bytes(b"corrupt" * 10)
    second = _run(str(cache))
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == first.stdout.split()  # recompiled, same value
