"""xlakit: run PyTorch programs lazily on XLA and see every step."""
from __future__ import annotations

from .version import __version__  # noqa: F401

# Importing changes nothing global in torch or JAX: xlakit.device() installs what
# the lazy device needs (xlakit/runtime.py).
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
