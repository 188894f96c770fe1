"""Executables by key: an in-memory LRU, then xlakit's executables on disk by the same
key, then JAX's persistent compilation cache.

JAX's cache is keyed by the lowered program, so a hit there still pays for lowering
the graph; xlakit's own files are keyed by xlakit's key (keys.py: graph, inputs,
donors, backend and versions, flags), so a second process that traces the same
step loads its executable without lowering or compiling it."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import inspect
import os
import pickle
import stat
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.monitoring
from jax.experimental.compilation_cache import compilation_cache

from ..config import private_dir
from ..core.checks import StepChecks
from ..lowerings.numerics import Layout
from ..core.record import Collective, CostInfo, MemoryInfo, ShardingInfo


@dataclasses.dataclass
class Entry:
    compiled: object          # jax.stages.Compiled
    key: object               # keys.Key
    hlo: str                  # optimized HLO text, for views
    checks: StepChecks = StepChecks()   # what its extra output reports (core/checks.py)
    numerics: Layout | None = None      # what its numerics output holds; None: it has none
    memory: MemoryInfo | None = None   # from the compiled executable (analysis/executable.py)
    cost: CostInfo | None = None
    shardings: ShardingInfo | None = None   # None: one device
    collectives: tuple[Collective, ...] = ()
    uses: int = 0             # executions so far (the engine counts them as it runs)
    # GraphInfo per metadata digest: a hit with the same metadata reuses it.
    graph_infos: dict = dataclasses.field(default_factory=dict)
    search: object = None     # a guarded executable's engine/numerics.Search (made in this process, never stored)
    last_run: object = None   # the StepRecord of its latest Engine.run_compiled (torch.compile's): the next copies it


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


_EXECUTABLES: Path | None = None   # where xlakit's executables are kept; None: not on disk


def load(key: str) -> Entry | None:
    """The entry stored for `key` by an earlier process, or None. An entry is trusted by what
    it holds, not by its name: one that holds another key (a copied or badly synced cache
    directory), or cannot be read back (cut short, written by another jaxlib, a directory),
    is a warning and a miss, and is deleted where it can be."""
    if _EXECUTABLES is None:
        return None
    path = _EXECUTABLES / f"{key}.pickle"
    try:
        with open(path, "rb") as f:
            stored = pickle.load(f)
        if getattr(stored.get("key"), "key", None) != key:
            raise ValueError(f"it holds the executable of another key ({getattr(stored.get('key'), 'key', None)})")
        from jax._src.lib import lapack
        from jax.experimental.serialize_executable import deserialize_and_load

        # A CPU executable calls LAPACK (lu, solve, eigh, ...) through functions that JAX
        # binds when it lowers a linalg op; loaded with no lowering, they were unbound and
        # its first run segfaulted. jax.export binds them the same way before it runs
        # deserialized code.
        lapack._lapack.initialize()
        # on the device it was compiled for: by default JAX loads it for all of the backend's
        # devices, and with several (8 CPU host devices) it then expected 8 shards per argument
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in stored.pop("devices")]
        compiled = deserialize_and_load(stored.pop("executable"), stored.pop("in_tree"), stored.pop("out_tree"),
                                        execution_devices=devices)
        return Entry(compiled=compiled, **stored)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - a broken entry is a miss, and is written anew
        _unusable(path, e)
        return None


def _unusable(path: Path, error: Exception) -> None:
    warnings.warn(f"xlakit: the cache entry {path} cannot be used ({type(error).__name__}: {error}); "
                  "compiling this step again.", stacklevel=4)
    _remove(path)


def _remove(*paths: Path) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError:  # a directory, or not this user's to delete: the next write warns in turn
            pass


def store(entry: Entry) -> None:
    """Keep a one-device entry on disk for later processes; written whole or not at all.
    (Sharded executables are left to JAX's cache: loading one needs its device assignment.)"""
    if _EXECUTABLES is None or entry.shardings is not None:
        return
    part = None
    try:
        from jax.experimental.serialize_executable import serialize
        executable, in_tree, out_tree = serialize(entry.compiled)
        stored = {"executable": executable, "in_tree": in_tree, "out_tree": out_tree, "devices": _devices(entry),
                  "key": entry.key, "hlo": entry.hlo, "checks": entry.checks, "numerics": entry.numerics,
                  "memory": entry.memory, "cost": entry.cost, "collectives": entry.collectives}
        with tempfile.NamedTemporaryFile(dir=_EXECUTABLES, suffix=".part", delete=False) as f:
            part = Path(f.name)
            pickle.dump(stored, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(part, _EXECUTABLES / f"{entry.key.key}.pickle")
    except Exception as e:  # noqa: BLE001 - the disk is a cache: a failed write costs a later compile only
        if part is not None:
            part.unlink(missing_ok=True)
        warnings.warn(f"xlakit: could not keep an executable on disk ({type(e).__name__}: {e}); "
                      "a later process will compile it again.", stacklevel=2)


def _devices(entry: Entry) -> list[int]:
    """The ids of the devices a one-device executable runs on (its one device)."""
    shardings = jax.tree.leaves((entry.compiled.input_shardings, entry.compiled.output_shardings))
    return sorted(d.id for d in shardings[0].device_set)


def _make_private(path: str) -> Path:
    """`path` as it is (made like any directory if missing), and in it xlakit's own
    directory, writable by this user alone: `path` may be /tmp or a team's, and what
    xlakit loads from the cache (pickles, executables) runs as this user's code."""
    Path(path).mkdir(parents=True, exist_ok=True)
    own = private_dir(path)
    own.mkdir(mode=0o700, exist_ok=True)
    found = os.lstat(own)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise PermissionError(f"{own} exists and is not a directory of this user's")
    os.chmod(own, 0o700)
    return own


def enable_persistent_cache(path: str | None) -> str | None:
    """Point JAX's persistent compilation cache, and xlakit's executables, at a
    directory of xlakit's own in `path`, private to the user (None: no disk cache). Called
    again in a running process, the next compile follows it: JAX decides once whether it
    uses its cache and where, until its cache is reset."""
    global _EXECUTABLES
    _EXECUTABLES = None
    compilation_cache.reset_cache()
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    try:
        own = _make_private(path)
    except OSError as e:
        warnings.warn(f"xlakit: cannot use {path!r} as the compilation cache ({e}); compiling without "
                      "a disk cache. Set XLAKIT_CACHE_DIR to a writable directory, or empty to silence this.",
                      stacklevel=2)
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(own))
    executables = own / "xlakit-executables"
    try:
        executables.mkdir(mode=0o700, exist_ok=True)
        _EXECUTABLES = executables
    except OSError:  # JAX's cache still saves the compile
        pass
    _forget_broken_entries()
    # Cache every executable: small graphs recompile as often as large ones.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _forget_broken_entries() -> None:
    """Wraps JAX's cache reads and writes (JAX internals, defensively: if they change, nothing
    is wrapped), for two things JAX does not do:
    - JAX writes an entry in place and never replaces one that exists: a write cut short (a
      full disk) left a truncated entry that every later process read, warned about and
      recompiled. An entry that fails to be written or read is deleted, so the next compile
      writes it whole (JAX still warns and compiles).
    - JAX trusts an entry by its file name: with two entries swapped, each program ran the
      other's executable. Each entry xlakit writes gets a seal beside it (its key and its
      bytes' SHA-256); an entry whose seal does not match is a warning and a miss, one with
      no seal (an older xlakit's) a miss."""
    try:
        from jax._src import compilation_cache as cc
        read, write = cc.get_executable_and_time, cc.put_executable_and_time
        read_sig, write_sig = inspect.signature(read), inspect.signature(write)
    except (ImportError, AttributeError, ValueError, TypeError):
        return
    if getattr(read, "_xlakit", False):
        return

    def entry_of(signature, args, kwargs) -> tuple[Path, str] | None:
        try:
            bound = signature.bind(*args, **kwargs).arguments
            return Path(cc._get_cache(bound["backend"]).path) / f"{bound['cache_key']}-cache", bound["cache_key"]
        except Exception:  # noqa: BLE001 - not JAX's layout: left as JAX does it
            return None

    def forget(entry: Path) -> None:  # best effort; JAX reports its own errors
        _remove(entry, _seal_of(entry))

    def healed(call, entry: Path, args, kwargs):
        try:
            return call(*args, **kwargs)
        except Exception:
            forget(entry)
            raise

    def checked_read(*args, **kwargs):
        found = entry_of(read_sig, args, kwargs)
        if found is None:
            return read(*args, **kwargs)
        entry, key = found
        if entry.exists() and not _sealed(entry, key):
            if _seal_of(entry).exists():  # with no seal (an older xlakit's entry): a quiet miss
                _unusable(entry, ValueError("its seal does not match its key and bytes"))
            forget(entry)
            return None, None
        return healed(read, entry, args, kwargs)

    def sealing_write(*args, **kwargs):
        found = entry_of(write_sig, args, kwargs)
        if found is None:
            return write(*args, **kwargs)
        done = healed(write, found[0], args, kwargs)
        _seal(*found)
        return done

    checked_read._xlakit = sealing_write._xlakit = True
    cc.get_executable_and_time, cc.put_executable_and_time = checked_read, sealing_write


def _seal_of(entry: Path) -> Path:
    return entry.with_name(entry.name + ".xlakit-seal")


def _seal_text(entry: Path, key: str) -> str:
    return f"{key}\n{hashlib.sha256(entry.read_bytes()).hexdigest()}\n"


def _seal(entry: Path, key: str) -> None:
    """Writes the seal of a whole entry (none if JAX wrote nothing: a full disk)."""
    part = None
    try:
        text = _seal_text(entry, key)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, suffix=".part", delete=False) as f:
            part = Path(f.name)
            f.write(text)
        os.replace(part, _seal_of(entry))
    except OSError:  # unsealed, the entry is compiled again next time
        if part is not None:
            part.unlink(missing_ok=True)


def _sealed(entry: Path, key: str) -> bool:
    try:
        return _seal_of(entry).read_text() == _seal_text(entry, key)
    except OSError:
        return False


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
