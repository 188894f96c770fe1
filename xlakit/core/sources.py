"""Source lines: which Python lines recorded an op, and how a person reads them.

A node keeps two frames: the user's line, and the innermost line of a library
(transformers, ...) when the user's line called into one, since a recompile
inside `model.generate(...)` is explained by the library's line, not the call.
Names read as a person expects: a notebook cell is "cell 4 line 2", not
IPython's temporary file, and a warning is attributed to the user's line.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import site
import sys
import sysconfig
import threading
import warnings

import torch

from . import module_paths
from .ir import Frame, Source
from .state import PROCESS

_XLAKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package, not core/
_PACKAGE_DIRS = tuple({p + os.sep for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                            *site.getsitepackages())})
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep
# Packages whose frames are the dispatch machinery between a library's line and
# xlakit, never "the line that recorded an op".
_MACHINERY = ("torch", "torchgen", "functorch", "jax", "jaxlib", "typing_extensions")

USER, LIBRARY, MACHINERY = 0, 1, 2
_KIND: dict[str, int] = PROCESS.memo("core.sources: file kinds", 1 << 12,
                                     "whether a file is the user's, a library's or machinery, asked per stack frame")


# Per file, whether it is xlakit's own: its frames are skipped before a walk starts
_OWN: dict[str, bool] = PROCESS.memo("core.sources: xlakit's files", 1 << 12, "whether a frame is xlakit's, asked per op")
# a frame that a generator, coroutine or async generator runs: resumed by any caller
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _kind(filename: str) -> int:
    kind = _KIND.get(filename)
    if kind is None:
        kind = _KIND[filename] = _classify(filename)
    return kind


def _classify(filename: str) -> int:
    package_dir = next((d for d in _PACKAGE_DIRS if filename.startswith(d)), None)
    if package_dir is not None:
        package = filename[len(package_dir):].split(os.sep, 1)[0]
        return MACHINERY if package in _MACHINERY else LIBRARY
    if filename.startswith("<ipython-input-"):  # a cell, as older IPython names it
        return USER
    if filename.startswith((_XLAKIT_DIR, _STDLIB_DIR, "<")):  # "<string>": code Python and torch generate
        return MACHINERY
    return USER


class _Capturing(threading.local):
    # recorded_at's Source, which the ops of its block are attributed to
    source: Source | None = None
    # (user, library, module, forward, Source) of the last capture: an op's neighbours mostly share its lines
    last: tuple = (None, None, None, None, None)
    # the frame the last op came from (past xlakit's own), the module call it ran in, and per instruction
    # of that frame the Source a forward op found there (`at`) and the frames a backward op's walk found
    # there (`walks`); released at each sync in this thread (release_frame)
    frame = None
    entry = None
    at: dict = {}
    walks: dict = {}


_CAPTURING = _Capturing()  # one thread-local read an op, not two (~0.1 µs of a replayed op)


@contextlib.contextmanager
def recorded_at(source: Source | None):
    """Attribute the ops of the block to `source`. torch.compile's backend runs
    FX nodes whose own lines Dynamo kept; the Python stack then only holds the
    frame Dynamo resumed, at the line of the previous graph break."""
    before, _CAPTURING.source = _CAPTURING.source, source
    try:
        yield
    finally:
        _CAPTURING.source = before


# Interned Frames and Sources: a training step records the same lines every step, and
# one shared object per line (not one per op) keeps Python's collector from running
# over thousands of them. Bounded: each re-run of a notebook cell makes new code objects.
_FRAMES: dict[tuple, Frame] = PROCESS.memo("core.sources: frames", 50_000, "one Frame per (file, line, function) recorded")
# Keyed by the ids of interned frames: a kept Source holds its frames, so an id in a key is never reused
_SOURCES: dict[tuple, Source] = PROCESS.memo("core.sources: sources", 50_000,
                                             "one Source per (user frame, library frame, module path)")


def _frame(code, line: int) -> Frame:
    # keyed by what the Frame holds, not the code object: hashing one hashes its constants, and
    # a code object Dynamo rewrote may hold a dict (torch_xla's clip_grad_norm_ resumed after a
    # graph break): recording under it raised "unhashable type: 'dict'"
    key = (code.co_filename, line, code.co_name)
    frame = _FRAMES.get(key)
    if frame is None:
        frame = _FRAMES[key] = Frame(*key)
    return frame


# The Frame of each (code object, instruction offset) a walk met. A frame's f_lineno decodes its
# code's line table from the start, every time: 0.1 µs in a short function, 3.3 µs at the end of a
# 300-line one, and a transformers op's walk reads it in the model's forward at every op. Keyed by
# the code's id (hashing a code object hashes its constants, above); each entry keeps its code
# alive, so an id in a key is never another code's.
_AT_OFFSET: dict[tuple, tuple] = PROCESS.memo("core.sources: frames by instruction", 50_000,
                                              "a walk's frame read without decoding its line table")


def _frame_of(frame) -> Frame:
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    seen = _AT_OFFSET.get(key)
    if seen is not None and seen[0] is code:
        return seen[1]
    made = _frame(code, frame.f_lineno)
    _AT_OFFSET[key] = (code, made)
    return made


# The Source of the forward op each autograd node was made for, by the node's sequence number: a
# backward op names the forward line whose gradient it computes. An op is recorded below autograd,
# after its node took the number before the current one; an op that made no node (no grad) finds
# that number taken by the op that did. Bounded; the oldest go first.
_FORWARD: dict[int, Source] = PROCESS.memo("core.sources: forward sources by sequence number", 1 << 16,
                                           "a backward op names the forward line whose gradient it computes")
_autograd_node = torch._C._current_autograd_node
_sequence_nr = torch.autograd._get_sequence_nr
_grad_enabled = torch.is_grad_enabled
_getframe = sys._getframe
_MODULE_STACK = module_paths.STACK


def capture(skip: int = 1) -> Source | None:
    """The innermost user line, the innermost library line below it, and the module path
    (for a backward op, also the forward op's Source). `skip`: how many frames up from here
    the walk starts (the recorder's own frames need no asking)."""
    capturing = _CAPTURING
    if capturing.source is not None:
        return capturing.source
    node = _autograd_node()
    entries = _MODULE_STACK.entries  # module_paths.innermost(), inlined
    entry = entries[-1] if entries else None
    frame = _getframe(skip)
    while frame is not None:  # past xlakit's own frames, made anew for each op
        filename = frame.f_code.co_filename
        own = _OWN.get(filename)
        if own is None:
            own = _OWN[filename] = filename.startswith(_XLAKIT_DIR)
        if not own or entry is not None and frame is entry.frame:
            break
        frame = frame.f_back
    # An op from the frame the last one came from (not None: a thread with no Python frame of its own),
    # in the same module call: what was found at this instruction before. While that frame runs, every
    # frame above it waits where it waited then; a generator's frame, which another caller may resume,
    # is not kept.
    again = frame is capturing.frame and entry is capturing.entry and frame is not None
    if node is None:
        if again:  # a forward op: the Source
            source = capturing.at.get(frame.f_lasti)
            if source is not None:
                if _grad_enabled():  # _name_forward_node, inlined: this is most ops' path
                    number = _sequence_nr() - 1
                    if number not in _FORWARD:
                        _FORWARD[number] = source
                return source
        module, forward = entry.path if entry is not None else "", None
        user, library = _walk(frame, entry)
    else:
        module, forward = module_paths.path_of(node, entry), _FORWARD.get(node._sequence_nr())
        # a backward op: the frames (autograd's engine calls each op of a backward from one frame and
        # instruction; the module path and forward op are the op's own)
        walked = capturing.walks.get(frame.f_lasti) if again else None
        user, library = walked or _walk(frame, entry)
    last = capturing.last
    if user is last[0] and library is last[1] and module == last[2] and forward is last[3]:
        source = last[4]
    else:
        if user is None and library is None and not module:
            return None
        key = (id(user), id(library), module, id(forward))  # interned frames and sources: identity is equality
        source = _SOURCES.get(key)
        if source is None:
            source = _SOURCES[key] = Source(user, library, module, forward)
        capturing.last = (user, library, module, forward, source)
    if frame is not capturing.frame or entry is not capturing.entry:
        kept = frame is not None and not frame.f_code.co_flags & _RESUMABLE
        capturing.frame, capturing.entry, capturing.at, capturing.walks = \
            (frame, entry, {}, {}) if kept else (None, None, {}, {})
    if capturing.frame is not None:
        if node is None:
            capturing.at[frame.f_lasti] = source
        else:
            capturing.walks[frame.f_lasti] = (user, library)
    if node is None:
        _name_forward_node(source)
    return source


def _name_forward_node(source: Source) -> None:
    """A forward op names the autograd node it made (the number before the next) after `source`."""
    if _grad_enabled():
        number = _sequence_nr() - 1
        if number not in _FORWARD:
            _FORWARD[number] = source


def release_frame() -> None:
    """Let go of the frame capture keeps (at a sync): a function that returned since keeps its
    locals, tensors among them, only until the next op or sync."""
    capturing = _CAPTURING
    capturing.frame, capturing.entry, capturing.at, capturing.walks = None, None, {}, {}


def _walk(frame, entry: module_paths.Entry | None) -> tuple[Frame | None, Frame | None]:
    """(innermost user frame, innermost library frame below it) from `frame` outwards; from
    `entry`'s frame on, what its first walk found (module_paths.Entry: those frames wait at
    the same lines while it runs). This runs for every recorded op: its lookups are inlined."""
    stop = entry.frame if entry is not None else None
    library = None
    while frame is not None:
        if frame is stop:
            above = entry.above
            if above is None:
                above = entry.above = _walk(frame.f_back, entry.parent)
            return above[0], library or above[1]
        code = frame.f_code
        filename = code.co_filename
        kind = _KIND.get(filename)
        if kind is None:
            kind = _kind(filename)
        if kind == USER:
            return _frame_of(frame), library
        if kind == LIBRARY and library is None:
            library = _frame_of(frame)
        frame = frame.f_back
    return None, library


def user_line() -> str | None:
    """The user's line as a person reads it ("cell 4 line 3"), for a step's trigger."""
    source = capture()
    return short(source.user) if source is not None and source.user is not None else None


def fallback_line(source: Source | None, op) -> str:
    """'cell 4 line 3 (aten.nonzero.default)': where an op ran eagerly, for its sync's trigger."""
    where = short(source.user) if source is not None and source.user is not None else "?"
    return f"{where} ({op})"


def cell_name(file: str, line: int) -> str | None:
    """'cell 4 line 3' for a line of a notebook cell (IPython's own filename map)."""
    shell = _ipython()
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(file)
    return None if number is None else f"cell {number} line {line}"


def _ipython():
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def short(frame: Frame | None) -> str:
    """'cell 4 line 3', or 'modeling_gpt2.py:120'."""
    if frame is None:
        return ""
    return cell_name(frame.file, frame.line) or f"{os.path.basename(frame.file)}:{frame.line}"


def describe(source: Source | None) -> str:
    """'cell 4 line 2 -> modeling_gpt2.py:120 in forward'; '' when unknown."""
    if source is None:
        return ""
    parts = [short(source.user)] if source.user is not None else []
    if source.library is not None:
        parts.append(f"{short(source.library)} in {source.library.function}")
    return " -> ".join(parts)


def warn(message: str, source: Source | None, category=UserWarning) -> None:
    """A warning attributed to the user's line (a cell reads as "cell 4"), or where
    there is none to the library's line that called xlakit; never to xlakit."""
    frame = source and (source.user or source.library)
    if frame is None:
        warnings.warn(message, category, stacklevel=3)
        return
    cell = cell_name(frame.file, frame.line)
    warnings.warn_explicit(message, category, cell.rpartition(" line ")[0] if cell else frame.file, frame.line)


def of_stack_trace(text: str, module: str = "") -> Source | None:
    """The Source of a traceback's text, as FX keeps one per node (`node.meta["stack_trace"]`):
    its 'File "/path/x.py", line 12, in forward' lines; `module` the node's module path."""
    frames = []
    for line in text.splitlines():
        if line.strip().startswith("File "):
            filename, _, rest = line.strip().removeprefix('File "').partition('", line ')
            number, _, function = rest.partition(", in ")
            if number.isdigit():
                frames.append(Frame(filename, int(number), function))
    source = of_traceback(frames)
    return Source(source.user, source.library, module) if source is not None and module else source


def of_traceback(frames: list[Frame]) -> Source | None:
    """The Source of a recorded stack, listed outermost first as tracebacks are
    (Dynamo's FX nodes keep one): its innermost user line and innermost library
    line; None when all of it is machinery (torch, Dynamo, xlakit)."""
    kinds = [(frame, _kind(frame.file)) for frame in reversed(frames)]
    user = next((frame for frame, kind in kinds if kind == USER), None)
    library = next((frame for frame, kind in kinds if kind == LIBRARY), None)
    return None if user is None and library is None else Source(user, library)
