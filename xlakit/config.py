"""User settings. Read at use, so changing them takes effect at once."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path


@dataclasses.dataclass
class Config:
    # Raise instead of running ops with no lowering eagerly on CPU.
    strict_lowering: bool = os.environ.get("XLAKIT_STRICT", "") not in ("", "0")
    # In-memory executables kept (least recently used go first).
    cache_size: int = int(os.environ.get("XLAKIT_CACHE_SIZE", "1024"))
    # Donate overwritten buffers at step markers.
    donate: bool = True
    # Wait for each execution to finish, so StepRecord.timings.execute is its
    # real duration; off lets tracing of the next step overlap execution (on
    # CPU only with JAX_CPU_ENABLE_ASYNC_DISPATCH=1: docs/process.md).
    wait_for_execution: bool = True
    # Keep a host copy of each integer or bool upload (.to(device), a CPU op's result) of at
    # most this many bytes while its device buffer lives, so that a Python read of a value
    # computed from such uploads alone (transformers' `if padding_mask.all():` on the
    # attention mask) is answered on the host, with no execution (docs/troubleshooting.md).
    # 0: never.
    host_copy_bytes: int = int(os.environ.get("XLAKIT_HOST_COPY_BYTES", str(1 << 20)))
    # Compute eager's checks in each step's executable (indices in range, no
    # integer division by zero) and raise eager's error after the step; off,
    # such input gives XLA's value silently (docs/bad_input.md).
    checks: bool = os.environ.get("XLAKIT_CHECKS", "1") != "0"
    # Find, inside each step's executable, the op that made the step's first NaN or
    # infinity from finite inputs, and raise FloatingPointError there (True) or warn
    # ("warn"); rec.numerics.first_nonfinite (docs/numerics.md). Off by default.
    check_nans: bool | str = {"": False, "0": False, "warn": "warn"}.get(os.environ.get("XLAKIT_CHECK_NANS", ""), True)
    # Record the absolute maximum of each module's values against its dtype's
    # largest finite value: rec.numerics.by_module (%%xla_step --ranges).
    record_ranges: bool = False
    # StepRecords kept in memory (xlakit.steps()); older ones are dropped.
    record_limit: int = int(os.environ.get("XLAKIT_RECORD_LIMIT", "10000"))
    # Warn when the steps one user line runs (a loop's step marker) compile more than this
    # many times after its first step, naming each miss's why; None: no budget. %%xla_step
    # --max-compiles N sets one per cell.
    max_recompiles: int | None = None
    # Raise instead of warning when a recompile budget is exceeded.
    strict_recompiles: bool = False


config = Config()


def default_cache_dir() -> str | None:
    """XLAKIT_CACHE_DIR wins (empty turns the disk cache off); else a per-user dir."""
    configured = os.environ.get("XLAKIT_CACHE_DIR")
    if configured is not None:
        return configured or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlakit")


def private_dir(path: str) -> Path:
    """xlakit's own directory in the cache dir `path`, one per user."""
    return Path(path) / f"xlakit-{os.getuid()}"
