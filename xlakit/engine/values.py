"""A lazy tensor's value (device data, a pending node output, or the error that kept it from
being computed), and the errors a read or a step raises when a value could not be computed."""
from __future__ import annotations

import copy

from ..core.ir import Aval, DeviceData, Graph, Node


class StepFailedError(RuntimeError):
    """Raised when a tensor is read whose computation could not be compiled
    (or whose step failed a check)."""


class StepFailedIndexError(StepFailedError, IndexError):
    """A tensor whose step failed an index check: an IndexError, as eager's."""


class LiveValue:
    """The value behind one or more lazy tensors: device data, or a pending
    node output, or the error that kept it from being computed.

    The registry maps a tensor's C++ TensorImpl to its value and holds a C++
    weak reference to that TensorImpl: Python's garbage collector may clear
    the attributes (and Python weak references) of a tensor subclass object
    that only C++ still holds (a functional wrapper's inner value), so neither
    can tell whether the tensor is alive.
    """

    __slots__ = ("aval", "node", "index", "data", "error", "label", "owner", "previous", "__weakref__")

    def __init__(self, aval: Aval, node: Node | None, index: int, data: DeviceData | None):
        self.aval, self.node, self.index, self.data, self.error = aval, node, index, data, None
        self.label: str | None = None
        # stamped at step markers (tensor.stamp_owners): the user tensor it belongs to, and the
        # buffer that tensor held before this value (given back if the step fails a check)
        self.owner: int | None = None
        self.previous: DeviceData | None = None

    def __repr__(self) -> str:
        state = "data" if self.data is not None else ("pending" if self.node is not None else "failed")
        return f"{self.aval}, {state}"

    def operand(self):
        """What this value contributes to a new node."""
        self.check_usable()
        self.resolve()
        return self.data if self.data is not None else (self.node, self.index)


    def resolve(self) -> None:
        """Swap a pending node output for its device data once it was computed."""
        node = self.node
        if node is not None and node.results is not None and node.results[self.index] is not None:
            self.data, self.node = node.results[self.index], None

    def check_usable(self) -> None:
        if self.error is not None:
            kind = StepFailedIndexError if isinstance(self.error, IndexError) else StepFailedError
            raise kind(f"this tensor's value could not be computed: {self.error}") from self.error

    def fail(self, error: BaseException) -> None:
        self.error, self.node = _untraced(error), None


def _untraced(error: BaseException) -> BaseException:
    """What a failed value keeps of `error`: a twin of its type and message, not the object,
    which is raised too. The frames its traceback gathers on its way out (the user's, holding
    the failed step's tensors, which hold this value through C++, where Python's collector
    cannot follow) stayed alive, and with them every tensor they held: memory, and pending work
    that a later step marker computed, raising that work's own error there."""
    try:
        return copy.copy(error)  # (no traceback, cause or context: they are not copied)
    except Exception:  # noqa: BLE001 - a constructor that takes more than the message (NodeFailedError)
        return (StepFailedIndexError if isinstance(error, IndexError) else StepFailedError)(str(error))


class StepExecutionError(RuntimeError):
    """The device could not run a compiled step (out of memory, runtime fault)."""


def execution_error(error: BaseException, graph: Graph | None) -> StepExecutionError:
    asked = ""
    if graph is not None:
        asked = (f" It reads {sum(a.nbytes for a in graph.param_avals):,} bytes of inputs and "
                 f"writes {sum(a.nbytes for a in graph.root_avals):,} bytes of outputs.")
    return StepExecutionError(f"xlakit: the device could not run this step: {str(error).rstrip('.')}.{asked} "
                              "Tensors it was updating in place keep their values from before it (parameters, "
                              "optimizer state and its CPU step count); the values it would have made keep this "
                              "error. Other host state your code changed while recording it stays changed.")


def dropped(error: StepExecutionError, targets) -> StepExecutionError:
    """A step the device could not run is dropped whole, as eager stops at the allocation that
    failed before any update: a tensor the user made on the device (tensor.own: parameters,
    optimizer state, what `.to` moved) gets back the buffer it held before the step; the values
    the step made anew keep the error. A buffer the device took anyway (a runtime fault after the
    executable started, which donated it) cannot be given back: the error names those tensors."""
    lost = []
    for t in targets:
        previous, t.previous = t.previous, None
        if previous is not None and previous.array is not None and not previous.array.is_deleted():
            t.data, t.node = previous, None
        else:
            if previous is not None:
                lost.append(t.label or previous.label or str(t.aval))
            t.fail(error)
    if not lost:
        return error
    return StepExecutionError(f"{error} The device took the buffers of {len(lost)} tensor(s) it was updating in "
                              f"place, which lost their values too: {', '.join(sorted(set(lost)))}.")
