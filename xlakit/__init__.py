"""xlakit: run PyTorch programs lazily on XLA and see every step."""
from __future__ import annotations

from .version import __version__  # noqa: F401

# Importing changes nothing global in torch or JAX: xlakit.device() installs what
# the lazy device needs (xlakit/runtime.py).
from .api import capture, clear_cache, device, last_step, mark_step, metrics, reset_metrics, save, steps, sync, wait
from .config import config
from .labels import label
from .record import StepRecord
from .sharding import Mesh
from .spmd import mark_sharding, shard_module


def explain(fn, *args, **kwargs):
    """Graph breaks of `fn(*args, **kwargs)` per path: Dynamo FX, Dynamo -> HLO,
    lazy, and torch_xla's when installed. Runs `fn` once per path. The report
    shows itself as a table, HTML, and a widget with the FX graphs."""
    from .breaks import explain as run
    from .notebook.breaks_view import BreakView

    return BreakView.of(run(fn, *args, **kwargs))


def sharding_view(step: StepRecord | None = None):
    """How the inputs and outputs of `step` (default: the last) are laid out over
    the mesh, per dim and device; its collectives and memory per device. Shows
    itself as text and HTML."""
    from .notebook.sharding_view import ShardingView

    return ShardingView(step if step is not None else last_step())


def load_ipython_extension(ipython) -> None:
    """`%load_ext xlakit`: registers the %%xla_step and %xla_history magics."""
    from .notebook import load_ipython_extension as load

    load(ipython)


__all__ = ["device", "mark_step", "sync", "wait", "save", "steps", "last_step", "capture", "metrics",
           "reset_metrics", "clear_cache", "config", "label", "explain", "StepRecord", "Mesh", "mark_sharding",
           "shard_module", "sharding_view"]
