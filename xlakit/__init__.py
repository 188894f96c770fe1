"""xlakit: run PyTorch programs lazily on XLA and see every step.

The public names, and where each lives. Importing changes nothing global in
torch or JAX: xlakit.device() installs what the lazy device needs
(front/install.py). The notebook's names load IPython and widgets, so they
are imported on first use.
"""
from __future__ import annotations

import importlib

from .config import config
from .core import record
from .core.record import StepRecord
from .core.sharding import Mesh
from .front.labels import label
from .front.spmd import mark_sharding, shard_module
from .notebook.render import text as _step_text
from .session import (capture, clear_cache, device, last_step, mark_step, metrics, profile, reset, reset_metrics, save,
                      steps, sync, wait)
from .version import __version__

# A record prints as the step view's text. Core holds no words and imports nothing above it,
# so the package root, which sees both the schema and the views, binds them.
StepRecord.__repr__ = _step_text

# name -> the module that defines it, imported when the name is first read
_ON_FIRST_USE = {
    "explain": "xlakit.notebook.breaks_view",
    "history": "xlakit.notebook.history_plot",
    "sharding_view": "xlakit.notebook.sharding_view",
    "load_ipython_extension": "xlakit.notebook",  # `%load_ext xlakit`
    "info": "xlakit.environment",  # what a bug report needs (`python -m xlakit info`)
}
# modules read as attributes: xlakit.torch_xla.step() is torch_xla's step marker, with xlakit's views
_MODULES = {"torch_xla": "xlakit.integrations.torch_xla"}


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module 'xlakit' has no attribute {name!r}")


__all__ = ["device", "mark_step", "sync", "wait", "save", "steps", "last_step", "capture", "profile", "history", "metrics",
           "reset_metrics", "clear_cache", "reset", "config", "label", "explain", "StepRecord", "Mesh", "mark_sharding",
           "shard_module", "sharding_view", "record", "info", "__version__"]
