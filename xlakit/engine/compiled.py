"""torch.compile's graphs run on device buffers, donating the state they update.

A graph torch.compile made (integrations/dynamo.py) is traced once through the
lazy engine; later calls run its executable on their inputs' buffers. Where the
graph updates an input in place (a parameter, an optimizer moment, a step count,
BatchNorm's running statistics), AOTAutograd returns the new value and copies
it into the input after the call: the old buffer is dead once the executable
ran, so it is donated (as a step marker donates on the lazy path) whenever no
other tensor, pending or computed, still reads it.

The graphs of a training step are not run one by one: each call records its
traced graph again into the lazy IR (core/ir.instantiate), reading the call's
inputs, and the step marker the optimizer's graph ends with computes forward,
backward and optimizer step as one executable (integrations/compiled_call.py says when).
Of a graph recorded again only the nodes its returned tensors hold are made; a step the
tape replays whole makes no other.

An input still pending that is a constant fill of computed operands (autograd's
`ones_like(loss)` grad seed, fed to a backward graph that runs now) is computed by its
lowering alone: one dispatch, not a step of its own.
"""
from __future__ import annotations

import collections

from ..core.ir import DeviceData, op_name, operand_data, pending_nodes
from ..core.record import Trigger
from ..lowerings import to_jax
from ..lowerings.factories import FILLS
from . import stages
from .executor import Engine


def fill_constants(values: list) -> None:
    """Compute each pending value in `values` (LiveValues, or None) that is a fill of computed
    operands by its lowering alone, with no step: a graph's inputs, fed before it runs."""
    for value in values:
        node = value.node if value is not None else None
        if node is None or op_name(node.op) not in FILLS:
            continue
        operands = [operand_data(o) for o in node.operands]
        if any(o is None for o in operands):
            continue
        arrays = to_jax.evaluate(node, [o.array for o in operands])
        if arrays is not None:
            node.results = [DeviceData(a, aval) for a, aval in zip(arrays, node.avals)]
            value.resolve()


def donatable(engine: Engine, buffers: list[DeviceData], fed: list[DeviceData]) -> bool:
    """Whether a call fed `fed` may donate each of `buffers` (the inputs its graph updates in
    place), by stages.why_not_donated's rule: each held by its input's tensor alone, read by no
    pending computation, fed once."""
    wanted = {id(b) for b in buffers}
    values = engine.held_values()
    for value in values:
        value.resolve()
    read = {i for i, n in collections.Counter(map(id, fed)).items() if n > 1}
    pending = [v.node for v in values if v.node is not None]
    for node in pending_nodes(pending) if pending else ():
        read.update(id(d) for d in map(operand_data, node.operands) if d is not None and id(d) in wanted)
    held = stages.holders(values, read)
    return all(stages.why_not_donated(b, held, kept_by_update=1) is None for b in buffers)


def run(engine: Engine, entry, arrays: list, donated: dict[int, DeviceData], *, metadata: str):
    """Run a compiled graph's executable on `arrays`, giving it the `donated` buffers
    (by parameter position); a StepRecord of trigger `compiled` that shows the graph whose
    metadata digest is `metadata` (two graphs of one key, from two modules, share an
    executable, not their module paths). Returns the output arrays."""
    note = "" if donated else "compiled call: an input it updates is still read elsewhere, or it updates none"
    return engine.run_compiled(entry, arrays, donated, trigger=Trigger.COMPILED, note=note, metadata=metadata)
