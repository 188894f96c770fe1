"""The public functions: step markers, partial syncs, save, records, counters."""
from __future__ import annotations

import torch

from .core.record import StepRecord, Trigger
from .core.sources import user_line
from .core.state import PROCESS
from .engine.executor import current
from .front import install
from .front.recorder import DEVICE
from .front.tensor import lazy_values

__all__ = ["device", "mark_step", "sync", "wait", "save", "steps", "last_step", "capture", "profile", "metrics",
           "reset_metrics", "clear_cache", "reset"]


def device() -> torch.device:
    """The lazy XLA device: whatever platform JAX runs on (CPU, GPU, TPU). The
    first call installs what the device needs in torch and JAX (front/install.py)."""
    install.install()
    return DEVICE


def mark_step() -> None:
    """Step marker: compute all pending work of all live tensors; may donate."""
    current().mark_step(trigger=Trigger.MARK_STEP, source=user_line())


def sync(tensors=None) -> None:
    """`sync()` is a step marker; `sync([t, ...])` computes only those, never donating."""
    if tensors is None:
        current().mark_step(trigger=Trigger.SYNC, source=user_line())
    else:
        current().sync(lazy_values(tensors), trigger=Trigger.SYNC, source=user_line())


def wait() -> None:
    """Block until every dispatched step has finished executing. Only needed
    with `config.wait_for_execution = False` (tracing the next step while the
    device runs this one), e.g. to time steps or before reading StepRecords."""
    current().wait()


def save(obj, path) -> None:
    """torch.save: lazy tensors are written as CPU tensors, computed in one
    partial sync that never donates (front/serialization.py)."""
    device()
    torch.save(obj, path)


def steps() -> list[StepRecord]:
    """The kept StepRecords, oldest first (the newest `config.record_limit`)."""
    return list(current().log.records)


def last_step() -> StepRecord | None:
    records = current().log.records
    return records[-1] if records else None


def capture():
    """`with xlakit.capture() as steps: ...` -- `steps` is the list of the
    StepRecords of exactly the executions inside the block (torch_xla's
    adapter's included; not those other threads run meanwhile), in order;
    it holds them also when the block raises, and captures nest."""
    return current().log.capture()


def profile(runs: int = 1):
    """`with xlakit.profile() as steps: ...` -- as capture(), and each step executed inside is
    measured: after it ran, its cached executable runs `runs` more times (the median is kept)
    under JAX's profiler, on copies of the inputs it donates, and `rec.profile` says where the
    time went, per HLO op, node, module and line, and what profiling cost. The step itself, its
    key and its cache hit are as without profiling. Meanwhile the device holds a copy of what the
    step donates (a training step's parameters and optimizer state): one that fills the device's
    memory cannot be profiled this way."""
    return current().profiled(runs)


def metrics() -> dict[str, int]:
    return current().metrics()


def reset_metrics() -> None:
    """Zero the counters and forget step records (their numbering goes on); the caches,
    memos and histories stay. `reset()` empties all of them."""
    current().reset_metrics()


def clear_cache() -> None:
    """Forget the in-memory executables (the disk cache stays): the next step of
    each graph compiles or loads from disk again. Records, counters and the other
    caches stay; `reset()` empties all of them."""
    current().cache.clear()


def reset() -> None:
    """Empty everything xlakit keeps in this process (core/state.py lists it):
    executables, step records (numbered from 0 again), counters, memos, histories,
    warned-once sets. The same program then gives the records and keys a fresh
    process gives. It first waits for dispatched steps and reads their checks, so a
    failed check raises here, as `wait()` does, and nothing is reset.

    Live lazy tensors lose nothing: computed values stay on the device, and pending
    work stays pending, computed at the next sync. Settings (`xlakit.config`), the
    disk cache and tensor labels stay."""
    current().wait()
    PROCESS.reset()
