"""Executables by key: an in-memory LRU in front of JAX's persistent cache on disk."""
from __future__ import annotations

import collections
import dataclasses
import inspect
import os
import threading
import warnings
from pathlib import Path

import jax
import jax.monitoring

from .checks import StepChecks
from .record import Collective, CostInfo, MemoryInfo, ShardingInfo


@dataclasses.dataclass
class Entry:
    compiled: object          # jax.stages.Compiled
    key: object               # keys.Key
    hlo: str                  # optimized HLO text, for views
    checks: StepChecks = StepChecks()   # what its extra output reports (xlakit/checks.py)
    memory: MemoryInfo | None = None   # from the compiled executable (xlakit/analysis.py)
    cost: CostInfo | None = None
    shardings: ShardingInfo | None = None   # None: one device
    collectives: tuple[Collective, ...] = ()
    uses: int = 0             # executions so far (the engine counts them as it runs)
    # GraphInfo per metadata digest: a hit with the same metadata reuses it.
    graph_infos: dict = dataclasses.field(default_factory=dict)


class ExecutableCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: collections.OrderedDict[str, Entry] = collections.OrderedDict()

    def get(self, key: str) -> Entry | None:
        """The entry for `key` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Entry) -> None:
        self._entries[key] = entry
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def default_cache_dir() -> str | None:
    """XLAKIT_CACHE_DIR wins (empty turns the disk cache off); else a per-user dir."""
    configured = os.environ.get("XLAKIT_CACHE_DIR")
    if configured is not None:
        return configured or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlakit", "jax")


def enable_persistent_cache(path: str | None) -> str | None:
    """Point JAX's persistent compilation cache at `path` (private to the user)."""
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    try:
        Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
    except OSError as e:
        warnings.warn(f"xlakit: cannot use {path!r} as the compilation cache ({e}); compiling without "
                      "a disk cache. Set XLAKIT_CACHE_DIR to a writable directory, or empty to silence this.",
                      stacklevel=2)
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    _forget_broken_entries()
    # Cache every executable: small graphs recompile as often as large ones.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _forget_broken_entries() -> None:
    """JAX writes a cache entry in place and never replaces one that exists: a
    write cut short (a full disk) leaves a truncated entry that every later
    process reads, warns about and recompiles. Delete an entry that fails to be
    written or read, so the next compile writes it whole. JAX still warns and
    compiles; this only heals the directory. Wraps JAX internals, defensively:
    if they change, nothing is wrapped."""
    try:
        from jax._src import compilation_cache as cc
        read, write = cc.get_executable_and_time, cc.put_executable_and_time
        read_sig, write_sig = inspect.signature(read), inspect.signature(write)
    except (ImportError, AttributeError, ValueError, TypeError):
        return
    if getattr(read, "_xlakit", False):
        return

    def forget(signature, args, kwargs):
        try:
            bound = signature.bind(*args, **kwargs).arguments
            entry = Path(cc._get_cache(bound["backend"]).path) / f"{bound['cache_key']}-cache"
            entry.unlink(missing_ok=True)
        except Exception:  # noqa: BLE001 - healing is best effort; JAX reports the error itself
            pass

    def healing(original, signature):
        def call(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            except Exception:
                forget(signature, args, kwargs)
                raise
        call._xlakit = True
        return call

    cc.get_executable_and_time = healing(read, read_sig)
    cc.put_executable_and_time = healing(write, write_sig)


class PersistentHits:
    """Counts JAX's persistent-cache hits, so a compile can tell it was served from disk."""

    def __init__(self):
        self._hits = 0
        self._lock = threading.Lock()
        jax.monitoring.register_event_listener(self._on_event)

    def _on_event(self, event: str, **_):
        if event == "/jax/compilation_cache/cache_hits":
            with self._lock:
                self._hits += 1

    @property
    def count(self) -> int:
        return self._hits
