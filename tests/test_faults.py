"""Faults: interrupted compiles, failing executions, bad cache directories."""
import os
from pathlib import Path

import jax
import pytest
import torch

import xlakit

from xlakit.engine.cache import private_dir
from xlakit.engine.executor import current
from xlakit.engine.values import StepExecutionError, StepFailedError
from xlakit.lowerings import to_jax

PROGRAM = ("import torch, xlakit, warnings\nwarnings.simplefilter('always')\n"
           "x = torch.arange(5.0).to(xlakit.device())\ny = (x * 7).cos().sum()\nxlakit.mark_step()\n"
           "print(xlakit.last_step().cache, round(y.item(), 4))")


# Files may grow to 1 KiB, and a write past that fails with EFBIG instead of
# killing the process: what a full disk looks like to the cache. torch writes a
# generated module of its own on its first meta-kernel call: done before.
FULL_DISK = ("import resource, signal, torch, xlakit\ntorch.ones(2, device='meta') * 2\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n")


def _run(new_python, cache_dir: str, prefix: str = ""):
    return new_python("-c", prefix + PROGRAM, env={**os.environ, "XLAKIT_CACHE_DIR": cache_dir})


def _eager_value() -> str:
    return str(round((torch.arange(5.0) * 7).cos().sum().item(), 4))


def test_keyboard_interrupt_during_compile_leaves_the_engine_consistent(dev, monkeypatch):
    x = torch.arange(4.0).to(dev)
    xlakit.mark_step()
    y = x.exp() * 3

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(to_jax, "lower", interrupted)
    with pytest.raises(KeyboardInterrupt):
        xlakit.mark_step()
    monkeypatch.undo()
    xlakit.mark_step()  # the same pending work, now compiled
    torch.testing.assert_close(y.cpu(), torch.arange(4.0).exp() * 3)
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def _device_fault(monkeypatch, message: str) -> None:
    """The device reports `message` for every execution, once it has run (until monkeypatch.undo())."""
    def fault(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(jax, "block_until_ready", fault)


def test_a_failing_execution_is_a_clear_error_and_the_engine_goes_on(dev, monkeypatch):
    x = torch.ones(3).to(dev)
    xlakit.mark_step()
    y = x * 2
    _device_fault(monkeypatch, "RESOURCE_EXHAUSTED: injected")
    with pytest.raises(StepExecutionError, match=r"could not run this step.*RESOURCE_EXHAUSTED.*12 bytes of outputs"):
        xlakit.mark_step()
    monkeypatch.undo()
    with pytest.raises(StepFailedError, match="RESOURCE_EXHAUSTED"):
        y.cpu()
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]      # inputs were not lost
    assert (x + 1).cpu().tolist() == [2.0, 2.0, 2.0]


def test_unusable_cache_dir_warns_and_compiles_without_it(new_python, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = _run(new_python, str(blocker / "cache"))
    assert done.returncode == 0, done.stderr
    assert "cannot use" in done.stderr and "compilation cache" in done.stderr
    assert done.stdout.split()[0] == "miss"


@pytest.mark.parametrize("damage", ["overwritten", "truncated"])
def test_corrupt_cache_entries_mean_a_recompile_not_a_crash(new_python, tmp_path, damage):
    cache = tmp_path / "cache"
    first = _run(new_python, str(cache))
    assert first.returncode == 0 and first.stdout.split()[0] == "miss"
    entries = [p for p in Path(cache).rglob("*") if p.is_file()]
    assert entries
    for p in entries:  # other bytes, or a write cut short (a full disk, a killed copy)
        p.write_bytes(b"corrupt" * 10 if damage == "overwritten" else p.read_bytes()[:len(p.read_bytes()) // 2])
    second = _run(new_python, str(cache))
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == first.stdout.split()  # recompiled, same value
    assert "cannot be used" in second.stderr  # xlakit's warning: no entry matches its seal
    third = _run(new_python, str(cache))  # the corrupt entries were replaced by whole ones
    assert third.returncode == 0 and third.stdout.split() == ["persistent_hit", _eager_value()], third.stderr


OTHER_PROGRAM = PROGRAM.replace("(x * 7).cos()", "(x * 5).sin()")  # the same inputs and outputs


def _kind(path: Path) -> str:
    """Which of a program's entries a file is: xlakit's, JAX's, or the seal of JAX's."""
    return path.parent.name if path.suffix == ".pickle" else path.name.rsplit("-", 1)[-1]


def _swapped(tmp_path, new_python, *, drop_xlakit_entries: bool) -> Path:
    """A cache directory of PROGRAM's whose entries hold OTHER_PROGRAM's bytes, under PROGRAM's names."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    for cache, program in ((mine, PROGRAM), (other, OTHER_PROGRAM)):
        assert new_python("-c", program, env={**os.environ, "XLAKIT_CACHE_DIR": str(cache)}).returncode == 0
    theirs = {_kind(p): p for p in other.rglob("*") if p.is_file()}
    for path in [p for p in mine.rglob("*") if p.is_file()]:
        if drop_xlakit_entries and path.suffix == ".pickle":
            path.unlink()
        else:
            path.write_bytes(theirs[_kind(path)].read_bytes())
    return mine


@pytest.mark.parametrize("entries", ["xlakit's and JAX's", "JAX's only"])
def test_a_cache_entry_is_trusted_by_what_it_holds_not_by_its_name(new_python, tmp_path, entries):
    # two programs' entries swapped (a copied cache directory, a bad sync): each program
    # loaded the other's executable as a persistent hit and gave the other's values
    cache = _swapped(tmp_path, new_python, drop_xlakit_entries=entries == "JAX's only")
    done = _run(new_python, str(cache))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["miss", _eager_value()], done.stderr
    assert "cannot be used" in done.stderr
    again = _run(new_python, str(cache))  # the bad entries were replaced by this program's own
    assert again.stdout.split() == ["persistent_hit", _eager_value()] and "cannot be used" not in again.stderr


def test_a_directory_where_an_entry_should_be_is_a_recompile_not_a_crash(new_python, tmp_path):
    cache = tmp_path / "cache"
    assert _run(new_python, str(cache)).stdout.split()[0] == "miss"
    for entry in [p for p in cache.rglob("*") if p.is_file()]:
        entry.unlink()
        entry.mkdir()
    done = _run(new_python, str(cache))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["miss", _eager_value()]


def test_full_disk_warns_and_recompiles_and_leaves_no_half_written_entries(new_python, tmp_path):
    cache = tmp_path / "cache"
    full = _run(new_python, str(cache), prefix=FULL_DISK)
    assert full.returncode == 0, full.stderr
    assert "Error writing persistent compilation cache entry" in full.stderr and "File too large" in full.stderr
    assert full.stdout.split() == ["miss", _eager_value()]
    # JAX writes in place; what it cut short was removed
    assert not list(private_dir(str(cache)).glob("*-cache"))
    again = _run(new_python, str(cache))  # disk space back: no corrupt entry to trip over, the entry is written
    assert again.returncode == 0 and "Error" not in again.stderr, again.stderr
    assert again.stdout.split() == ["miss", _eager_value()]
    assert _run(new_python, str(cache)).stdout.split() == ["persistent_hit", _eager_value()]


def test_device_out_of_memory_is_a_clear_error_and_the_session_goes_on(dev):
    # A real allocation failure, not an injected one: 2**46 float32 (256 TiB) is
    # more than a 64-bit process can map, so malloc fails at once whatever the
    # kernel's overcommit policy, and nothing is consumed.
    x = torch.arange(4.0).to(dev)
    y = x * 2
    xlakit.mark_step()
    current().cache.clear()  # the failed step's executable is then the only one, with no graph view
    huge = torch.zeros(2**46, dtype=torch.float32, device=dev)
    with pytest.raises(StepExecutionError,
                       match=r"could not run this step.*writes 281,474,976,710,656 bytes of outputs"):
        xlakit.mark_step()
    with pytest.raises(StepFailedError, match="281,474,976,710,656 bytes"):
        huge.cpu()
    del huge
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0] and y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    z = (x + y).sum()
    xlakit.mark_step()  # the next step compiles and runs
    assert z.item() == 18.0
    fresh = torch.zeros(3, device=dev)  # no inputs, as the failed step: the closest key
    xlakit.mark_step()
    assert fresh.cpu().tolist() == [0.0] * 3


def test_a_tensor_left_alone_for_steps_keeps_its_name_and_its_value_through_a_failed_step(dev):
    # markers pass over a value stamped before and unchanged since (tensor.stamp_owners): a name
    # given again still reaches it, and a failed step that updated it still gives its buffer back
    w = xlakit.label(torch.ones(3).to(dev), "w")
    w.mul_(2)
    xlakit.mark_step()
    other = torch.ones(2).to(dev)
    for _ in range(2):
        other.add_(1)
        xlakit.mark_step()
    xlakit.label(w, "renamed")
    total = (w * other.sum()).sum()
    xlakit.mark_step()
    assert "renamed" in [p.label for p in xlakit.last_step().graph.params]
    w.mul_(3)
    huge = torch.zeros(2**46, dtype=torch.float32, device=dev)
    with pytest.raises(StepExecutionError, match="keep their values from before it"):
        xlakit.mark_step()
    del huge
    assert w.cpu().tolist() == [2.0, 2.0, 2.0] and total.item() == 36.0
    w.add_(1)
    xlakit.mark_step()
    assert [d.label for d in xlakit.last_step().donated] == ["renamed"]
    assert w.cpu().tolist() == [3.0, 3.0, 3.0]


def _train(model, opt, batches, *, device=None):
    """AdamW steps on `batches` (inputs, whether the step also makes 256 TiB of activations:
    more than a 64-bit process can map). A step the device could not run is skipped, as eager's
    out-of-memory error stops its step before any update."""
    for x, too_big in batches:
        loss = model(x.to(device or x.device)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device is not None:
            activations = torch.zeros(2**46, device=device) if too_big else None  # noqa: F841 - a live output
            try:
                xlakit.mark_step()
            except StepExecutionError as error:
                assert too_big, error
                assert "keep their values from before it" in str(error)
            else:
                assert not too_big
    state = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq", "step")]
    return [t.detach().cpu() for t in (*model.parameters(), *state)]


def test_a_step_that_runs_out_of_memory_is_dropped_whole_and_a_smaller_batch_trains(dev):
    # the notebook pattern: catch the out-of-memory error, retry with a smaller batch. The failed
    # step's updates are dropped (parameters, AdamW's moments on the device, its step count on the
    # CPU), though its executable was given the buffers it updates in place
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    lazy = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    lazy.load_state_dict(eager.state_dict())
    wide = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    wide.load_state_dict(eager.state_dict())
    batches = [torch.randn(8, 6), torch.randn(8, 6), torch.randn(4, 6), torch.randn(4, 6)]
    plan = [(batches[0], False), (batches[1], True), (batches[2], False), (batches[3], False)]
    ran = [step for step in plan if not step[1]]

    def adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=0.1)

    want = _train(eager, adamw(eager), ran)
    spread = _train(wide, adamw(wide), [(x.double(), b) for x, b in ran])
    lazy = lazy.to(dev)
    got = _train(lazy, adamw(lazy), plan, device=dev)
    assert current().log.records[-1].donated, "the retried steps donate their buffers again"
    for g, w, s in zip(got, want, spread):
        tolerance = 10 * (w.double() - s).abs().max().item() + 1e-6  # eager's own float32 error, 10x
        torch.testing.assert_close(g, w, rtol=0, atol=tolerance)


def test_a_fault_in_a_later_run_names_the_tensors_whose_buffers_it_took(dev, monkeypatch):
    # from its second run on, an executable's donated buffers have no host copy: a fault there
    # (here one the device reports after the run started) loses them, and the error says which
    w = xlakit.label(torch.ones(3).to(dev), "w")
    other = torch.full((2,), 5.0).to(dev)
    for _ in range(2):
        w.mul_(2)
        xlakit.mark_step()
    assert current().log.records[-1].donated
    w.mul_(2)
    _device_fault(monkeypatch, "INTERNAL: injected")
    with pytest.raises(StepExecutionError, match=r"took the buffers of 1 tensor\(s\).*lost their values too: w\."):
        xlakit.mark_step()
    monkeypatch.undo()
    with pytest.raises(StepFailedError, match="INTERNAL: injected"):
        w.cpu()
    assert other.cpu().tolist() == [5.0, 5.0]


def test_owned_tensors_that_die_leave_the_owners_and_one_at_a_freed_address_is_owned_anew(dev):
    """front/tensor.py's owners, by the tensor's id, weakly: a dead tensor's entry goes with it (no
    growth over a loop), and a new tensor, which may take a dead one's address, gets an Owner of its own
    and its own value back from a failed step."""
    from xlakit.front import tensor as owners

    alive = len(owners._OWNED)
    seen = set()
    for i in range(40):
        t = torch.full((3,), float(i)).to(dev)
        t.add_(1)
        xlakit.mark_step()
        owner = owners.owner_of(t)
        assert owner is not None and owner.id not in seen
        seen.add(owner.id)
        del t
        assert len(owners._OWNED) == alive
    kept = torch.full((3,), 5.0).to(dev)
    xlakit.mark_step()
    kept.mul_(2)
    huge = torch.zeros(2**46, dtype=torch.float32, device=dev)
    with pytest.raises(StepExecutionError, match="keep their values from before it"):
        xlakit.mark_step()
    del huge
    assert kept.cpu().tolist() == [5.0, 5.0, 5.0]


def test_a_step_that_fails_again_gives_its_tensors_back_again(dev):
    """Until a run of an executable succeeded, each run keeps host copies of the buffers it donates
    (executor._run): the same failing step twice, a tensor it updated in place keeps its value both times."""
    w = torch.full((3,), 2.0).to(dev)
    xlakit.mark_step()
    for attempt in range(2):
        w.mul_(3)
        huge = torch.zeros(2**46, dtype=torch.float32, device=dev)
        with pytest.raises(StepExecutionError, match="keep their values from before it"):
            xlakit.mark_step()
        del huge
        assert w.cpu().tolist() == [2.0, 2.0, 2.0], attempt
    w.add_(1)
    xlakit.mark_step()
    assert w.cpu().tolist() == [3.0, 3.0, 3.0]
