"""xlakit: run PyTorch programs lazily on XLA and see every step."""
from __future__ import annotations

__version__ = "0.1.0"

import torchax  # noqa: F401  - imported first: it names torch's privateuse1 backend

from . import amp, device_module, modules  # noqa: F401  - register module hooks and torch.lazy
from .api import clear_cache, device, last_step, mark_step, metrics, reset_metrics, save, steps, sync, wait
from .config import config
from .labels import label
from .record import StepRecord


def explain(fn, *args, **kwargs):
    """Graph breaks of `fn(*args, **kwargs)` per path: Dynamo FX, Dynamo -> HLO,
    lazy, and torch_xla's when installed. Runs `fn` once per path."""
    from .breaks import explain as run

    return run(fn, *args, **kwargs)


def load_ipython_extension(ipython) -> None:
    """`%load_ext xlakit`: registers the %%xla_step and %xla_history magics."""
    from .notebook import load_ipython_extension as load

    load(ipython)


__all__ = ["device", "mark_step", "sync", "wait", "save", "steps", "last_step", "metrics",
           "reset_metrics", "clear_cache", "config", "label", "explain", "StepRecord"]
