"""One FX graph's compiled call: after its first call became one executable, a later call
with the same input signature runs that executable directly on the inputs' device buffers
(donating those it updates, engine/compiled.py), or records its graph again into the lazy
step (`CompiledCall.emit`); its random draws drawn again, and an optimizer's host step
counts read from the device value the last step computed (took_on_host, keep_on_device).
"""
from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import torch

from ..core import sharding, transfer
from ..core.ir import Aval, DeviceData, Graph, instantiate, structure
from ..core.state import PROCESS
from ..engine import compiled, keys
from ..engine.executor import current
from ..engine.values import LiveValue
from ..front.recorder import DEVICE, new_tensor, unwrap

# An optimizer's host step counts, each with the device value the last step computed for it:
# the next step reads that value instead of uploading the host tensor again (an upload of the
# step counts per step: ~270 µs of a small model's ~2.5 ms step; 1.4 ms for bench's Llama's 39).
_ON_DEVICE = PROCESS.memo("integrations.compiled_call: step counts on the device", 1 << 16,
                          "a host input a compiled step wrote is read by the next step from the device, not uploaded")


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
        current().recorded_graph(self.graph, operands, instance)  # with the roots its outputs hold
        return outputs

    def _arguments(self, inputs: list, values: list, of_value) -> list:
        """Per executable input, its device data (or, with `of_value` LiveValue.operand, a pending
        input's (node, output)): the inputs' (`of_value(LiveValue)`), draws drawn again, host
        inputs uploaded, constants as traced."""
        # all draws, in eager's order, also those the executable does not read: the generator
        # then stands where eager's does after the same call
        drawn = dict(zip(map(id, self.draws), transfer.to_device_many([d.draw() for d in self.draws]))) \
            if self.draws else {}
        avals = self.graph.param_avals
        arguments = []
        host = []  # host inputs (an optimizer's step counts), uploaded together
        for k, src in enumerate(self.param_sources):
            if isinstance(src, int):
                if values[src] is None:  # on the host: its value kept on the device, or uploaded below
                    arguments.append(_on_device(inputs[src], avals[k]))
                    if arguments[-1] is None:
                        host.append(k)
                else:
                    arguments.append(of_value(values[src]))
            elif isinstance(src, Draw):
                arguments.append(DeviceData(drawn[id(src)], avals[k]))
            else:
                arguments.append(src)
        if host:
            # read-only, as the device value kept for a host input is (took_on_host): a step that
            # uploads them and the next, which reads them kept, donate alike (one key, one compile)
            for k, array in zip(host, transfer.to_device_many([inputs[self.param_sources[k]] for k in host])):
                arguments[k] = DeviceData(array, avals[k], read_only=True)
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


def computed(t: torch.Tensor) -> bool:
    """Whether reading `t` waits for nothing: a host tensor, or a device one its step computed
    (not one a step dispatched ahead, `config.wait_for_execution = False`, is still computing)."""
    if t.device != DEVICE:
        return True
    state = unwrap(t)._state
    state.resolve()
    return state.data is not None and state.data.array.is_ready()


def took_on_host(host: torch.Tensor, new: torch.Tensor) -> bool:
    """Give `host`, a 0-d host input the step updated (an optimizer's step count), the value `new`
    (the graph's output for it, on the device, computed by the step that just ended): read directly
    (no sync; a scalar is whole in every process) and written as a number, not copied through a new
    host tensor (bench/RESULTS.md, tenth round); its device value kept for the next step to read
    instead of uploading the host tensor (_on_device). False where it is not such a case; the caller
    then copies `new` in as AOTAutograd would."""
    data = _count_buffer(host, new)
    if data is None:
        return False
    host.fill_(np.asarray(data.array).item())
    _keep(host, data, checked=True)
    return True


def keep_on_device(host: torch.Tensor, new: torch.Tensor) -> None:
    """Keep `new`, the device value a step computes for `host` (a step count the host computed
    itself, as `new` was not computed yet), for the next step to read once computed and found
    equal to the host's (_on_device): unread here, as reading it would wait for the step."""
    data = _count_buffer(host, new)
    if data is not None:
        _keep(host, data, checked=False)


def _count_buffer(host: torch.Tensor, new: torch.Tensor) -> DeviceData | None:
    """The buffer of `new`, the new value of `host`, where `host` is a 0-d host tensor and `new` on
    the device, bound to a buffer; else None."""
    if new.device != DEVICE or host.dim() != 0 or host.requires_grad or host.device.type != "cpu":
        return None
    state = unwrap(new)._state
    state.resolve()
    return state.data


def _keep(host: torch.Tensor, data: DeviceData, *, checked: bool) -> None:
    kept = _kept(host)
    # read-only: no step donates it, the next one reads it
    _ON_DEVICE[id(host)] = (kept[0] if kept else weakref.ref(host), _exact(host),
                            DeviceData(data.array, data.aval, read_only=True), checked)


def _on_device(host: torch.Tensor, aval: Aval) -> DeviceData | None:
    """The device value kept for this host tensor, if the host tensor still holds that value:
    compared by value, so any way of writing it counts. One the host computed itself is read
    once computed and compared first (uploaded until then)."""
    kept = _kept(host)
    if kept is None:
        return None
    ref, value, data, checked = kept
    if data.aval != aval or _exact(host) != value:
        return None
    if not checked:
        if not data.array.is_ready() or repr(np.asarray(data.array).item()) != value:
            return None
        _ON_DEVICE[id(host)] = (ref, value, data, True)
    return data


def _kept(host: torch.Tensor) -> tuple | None:
    """What _ON_DEVICE keeps for this host tensor (not for a dead one whose id it reuses), or None."""
    kept = _ON_DEVICE.get(id(host))
    return kept if kept is not None and kept[0]() is host else None


def _exact(host: torch.Tensor) -> str:
    """A 0-d host tensor's value, exactly: repr tells floats apart (-0.0 from 0.0)."""
    return repr(host.item())
