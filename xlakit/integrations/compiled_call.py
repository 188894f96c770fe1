"""One FX graph's compiled call: after its first call became one executable, a later call
with the same input signature runs that executable directly on the inputs' device buffers
(donating those it updates, engine/compiled.py), or records its graph again into the lazy
step (`CompiledCall.emit`); its random draws drawn again, and its host inputs (an optimizer's
step counts) passed from the host with the executable's call.
"""
from __future__ import annotations

import dataclasses

import torch

from ..core import sharding, transfer
from ..core.ir import DeviceData, Graph, instantiate, structure
from ..engine import compiled, keys
from ..engine.executor import current
from ..engine.values import LiveValue
from ..front.recorder import new_tensor


class CompiledCall:
    """One executable run directly on the inputs' buffers at every later call, or its
    graph recorded again into the lazy step (`emit`).

    param_sources: per executable input, a placeholder position, a constant
    DeviceData, or a draw (Draw); outputs: per FX output, (executable output index, aval), an
    input position (passed through), or None. metadata: the metadata digest of the graph
    traced (its lines and module paths: what its records show). graph: the execution's graph without its
    buffers (core/ir.structure), what `emit` records again. donors: the parameter positions
    of the inputs the graph updates in place -> their placeholder positions; the executable
    that donates their buffers is compiled at its first use (engine/compiled.py).
    draws: every random draw of the traced graph, in the order drawn. to_host: the outputs that
    AOTAutograd copies into a host input (an optimizer's step count): returned on the host,
    so that copy is a host one, not a read of a new device tensor.
    """

    def __init__(self, entry, metadata: str, graph: Graph, placement, param_sources: list, outputs: list,
                 draws: list, donors: dict, to_host: frozenset, updates: bool):
        self.entry, self.metadata, self.graph, self.placement = entry, metadata, graph, placement
        self.param_sources, self.outputs, self.draws = param_sources, outputs, draws
        self.donors, self.to_host, self.updates = donors, to_host, updates
        self.donating = None

    def __call__(self, inputs: list, values: list):
        """`values`: per input, the LiveValue behind it where it is on the device (else None)."""
        engine = current()
        arrays = [a.array for a in self._arguments(inputs, values, engine.read)]
        donated = self._donated(values)
        if donated and self.donating is None:  # (entry, its graph's metadata digest)
            self.donating = (engine.executable_for(self.graph, tuple(sorted(self.donors)), self.placement),
                             keys.metadata_digest(self.graph))
        entry, metadata = self.donating if donated else (self.entry, self.metadata)
        results = compiled.run(engine, entry, arrays, donated, metadata=metadata)
        on_device = any(v is not None for v in values)
        return [out if out is None else inputs[out] if isinstance(out, int)
                else _wrap_output(results[out[0]], out[1], on_device and k not in self.to_host)
                for k, out in enumerate(self.outputs)]

    def joins(self, values: list, *, training: bool, direct: bool) -> bool:
        """Whether this call is recorded into the lazy step (`emit`) rather than run now: a
        training graph's (forward or backward) on the device, and an optimizer step's (an
        inference graph that updates inputs, called by xlakit_backend) whose inputs are still
        pending (a backward's gradients): that step's marker then computes them all at once."""
        if all(v is None for v in values):
            return False
        if training:
            return True
        if not (direct and self.updates):
            return False
        for value in values:
            if value is not None:
                value.resolve()
                if value.node is not None:
                    return True
        return False

    def emit(self, inputs: list, values: list, bare: frozenset = frozenset(), into: dict | None = None):
        """The graph recorded again into the lazy IR on these inputs (pending ones read as
        they are): its outputs are pending lazy tensors, computed by the next sync, one
        executable with whatever else that sync computes (those wanted on the host too:
        xlakit_backend copies them there after that sync). The outputs at the positions `bare`
        are LazyTensors not wrapped by functionalization: the caller copies them into inputs, or reads them.
        `into`: per bare output position, the LazyTensor behind the input that output is copied into,
        which takes the new value itself where its shape and dtype match: no tensor is made for it
        (and none dies), and the caller's copy finds the input's own LazyTensor (dynamo._copy_in)."""
        operands = self._arguments(inputs, values, lambda value: value.operand())
        instance = instantiate(self.graph, operands)
        outputs = []
        engine = current()
        for k, out in enumerate(self.outputs):
            if out is None or isinstance(out, int):
                outputs.append(out if out is None else inputs[out])
                continue
            (position, index), aval = self.graph.roots[out[0]], out[1]
            target = into.get(k) if into else None
            if target is not None and engine.value_of(target).aval == aval:
                engine.register(target, LiveValue(aval, instance.root(position), index, None))
                outputs.append(target)
                continue
            new = new_tensor(aval, instance.root(position), index)
            outputs.append(new if k in bare else torch._to_functional_tensor(new))
        engine.recorded_graph(self.graph, operands, instance)  # with the roots its outputs hold
        return outputs

    def _arguments(self, inputs: list, values: list, of_value) -> list:
        """Per executable input, its data (or, with `of_value` LiveValue.operand, a pending
        input's (node, output)): the inputs' (`of_value(LiveValue)`), draws drawn again, constants as
        traced. Host inputs (an optimizer's step counts) and draws stay on the host, moved by the
        executable's call with its other arguments (transfer.host_data): an upload of their own
        cost 90-380 µs after an execution on JAX's CPU client."""
        # all draws, in eager's order, also those the executable does not read: the generator
        # then stands where eager's does after the same call
        drawn = {id(d): transfer.host_data(d.draw()) for d in self.draws}
        arguments = []
        for src in self.param_sources:
            if isinstance(src, int):
                value = values[src]
                arguments.append(transfer.host_data(inputs[src]) if value is None else of_value(value))
            elif isinstance(src, Draw):
                arguments.append(drawn[id(src)])
            else:
                arguments.append(src)
        return arguments

    def _donated(self, values: list) -> dict:
        """The buffers to donate at this call: all of the updated inputs', or none when
        one is still read elsewhere (another tensor, pending work, or twice in this call)."""
        if not self.donors or any(values[i] is None for i in self.donors.values()):
            return {}
        buffers = {p: values[i].data for p, i in self.donors.items()}
        fed = [v.data for v in values if v is not None]
        return buffers if compiled.donatable(current(), list(buffers.values()), fed) else {}


@dataclasses.dataclass(frozen=True)
class Draw:
    """A random draw of a traced graph: `draw()` draws it again from torch's CPU generator."""

    draw: object


def _wrap_output(array, aval, on_device: bool):
    if on_device:
        # an op's output, wrapped as functionalization wraps one (not a user's tensor
        # that front/tensor.py's owners track), as _outputs_like does
        return torch._to_functional_tensor(new_tensor(aval, data=DeviceData(array, aval)))
    return transfer.to_host(array, aval.dtype)


def signature(inputs) -> tuple:
    """What a compiled call's executable was specialized to: each tensor input's shape and
    dtype, each other input's type and value (an int may be a size, a repeat count)."""
    return tuple((t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else (type(t), t) for t in inputs)


def plan(entry, graph, placeholder_data, output_values, updated: list, draws: list,
          to_host: frozenset, updates: bool) -> CompiledCall | None:
    """How to run `entry` on new inputs, or None when an output is not one
    of its results (an input passed through, or a value computed earlier).
    `updated`: per first output, the device input it updates in place (_updated_inputs);
    `draws`: the graph's random draws (front/recorder.py draws_logged); `to_host`: CompiledCall's;
    `updates`: whether the graph updates any input in place."""
    where = {id(d): i for i, d in enumerate(placeholder_data) if d is not None}
    redrawn = {id(data): Draw(draw) for data, draw in draws}
    sources = []
    for p in graph.params:
        if id(p) not in where and id(p) not in redrawn:
            p.read_only = True  # a constant the compiled call keeps using
        sources.append(where.get(id(p), redrawn.get(id(p), p)))
    root_of = {(id(graph.nodes[n]), i): k for k, (n, i) in enumerate(graph.roots)}
    outputs = []
    for value in output_values:
        if value is None:
            outputs.append(None)
        elif isinstance(value, tuple) and (id(value[0]), value[1]) in root_of:
            outputs.append((root_of[(id(value[0]), value[1])], value[2]))
        elif isinstance(value, DeviceData) and id(value) in where:
            outputs.append(where[id(value)])  # an input passed through (saved for backward)
        else:
            return None
    parameter_of = {src: p for p, src in enumerate(sources) if isinstance(src, int)}
    donors = {parameter_of[i]: i for i, out in zip(updated, outputs)
              if i is not None and i in parameter_of and isinstance(out, tuple)
              and placeholder_data[i] is not None and out[1] == placeholder_data[i].aval}
    placement = sharding.plan(graph, tuple(sorted(donors))) if donors else None
    return CompiledCall(entry, keys.metadata_digest(graph), structure(graph), placement, sources, outputs,
                         list(redrawn.values()), donors, to_host, updates)
