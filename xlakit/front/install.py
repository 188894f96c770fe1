"""What xlakit changes in torch, JAX and Python for the whole process, in one
place, done once, on first use of the lazy device (`xlakit.device()`), never
at import: a user's own JAX or torch code in the same process is unaffected by
`import xlakit`. docs/process.md lists each change.
"""
from __future__ import annotations

import os
import threading
import warnings

import jax

from ..config import default_cache_dir
from ..engine import cache
from ..lowerings import jax_fixes
from . import (autocast, device_module, dynamo_frames, fake_tensors, functionalization, host_state, labels, modules,
               serialization)

_LOCK = threading.Lock()
_INSTALLED = False


def install() -> None:
    """Install everything the lazy device needs; idempotent."""
    global _INSTALLED
    if _INSTALLED:
        return
    with _LOCK:
        if _INSTALLED:
            return
        jax.config.update("jax_enable_x64", True)  # torch has int64/float64; JAX defaults to 32 bits
        if "JAX_CPU_ENABLE_ASYNC_DISPATCH" not in os.environ:
            # XLA:CPU runs an executable on the calling thread, not handed to a pool thread that
            # sleeps between calls: waking it cost ~50 µs per execution when Python ran between
            # (a 2x64 MLP, call+block: 65-90 µs vs 13 µs). Read when JAX makes its CPU client,
            # so only where the process had not used JAX yet.
            jax.config.update("jax_cpu_enable_async_dispatch", False)
        cache.enable_persistent_cache(default_cache_dir())
        # JAX warns when a donated buffer cannot be aliased to an output; the plan
        # only donates buffers with a same-shaped output, so the warning is noise.
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        functionalization.register_kernels()
        device_module.install()
        modules.install()
        labels.install()
        host_state.install()
        autocast.install()
        serialization.install()
        dynamo_frames.install()
        fake_tensors.install()
        jax_fixes.install()
        _INSTALLED = True
