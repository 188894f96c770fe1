"""Meshes and shardings: where each value of a graph lives when it runs on many devices.

JAX does the work: `jax.sharding.Mesh` and `NamedSharding` describe a
placement, `jax.jit(in_shardings=..., out_shardings=...)` compiles for it and
GSPMD/Shardy propagate it through the graph. This module says which sharding
each input and output of a graph gets (`plan`), how that enters the key
(`Placement.key_bytes`), and how an executable's shardings read as plain data
(`describe`).

A sharding travels beside each value: device data carries its jax.Array's
sharding; `mark_sharding` on a pending value is a node of its own
(`MARK_SHARDING`) that lowers to `jax.lax.with_sharding_constraint`.
"""
from __future__ import annotations

import dataclasses
import marshal
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from . import transfer
from .ir import Graph
from .record import MeshInfo, ShardingInfo, TensorSharding


class Mesh:
    """Devices arranged in a grid of named axes, as torch_xla's `Mesh`:
    `Mesh((2, 4), ("data", "model"))` over `jax.devices()` (all processes'),
    or over `devices` (a list of jax devices, row-major)."""

    def __init__(self, shape: Sequence[int], axis_names: Sequence[str], devices: Sequence | None = None):
        shape, axis_names = tuple(int(n) for n in shape), tuple(axis_names)
        if len(shape) != len(axis_names) or len(set(axis_names)) != len(axis_names):
            raise ValueError(f"xlakit.Mesh: {len(shape)} axis sizes {shape} need as many distinct names, "
                             f"got {axis_names}")
        size = math.prod(shape)
        available = list(jax.devices() if devices is None else devices)
        if len(available) < size or (devices is not None and len(available) != size):
            raise ValueError(f"xlakit.Mesh: shape {shape} needs {size} devices, "
                             f"{'given' if devices is not None else 'jax.devices() has'} {len(available)}. "
                             "On CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N (set before JAX "
                             "starts) makes N devices.")
        self.jax_mesh = jax.sharding.Mesh(np.array(available[:size], dtype=object).reshape(shape), axis_names)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.jax_mesh.devices.shape)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.jax_mesh.axis_names)

    @property
    def size(self) -> int:
        return self.jax_mesh.size

    @property
    def devices(self) -> list:
        return list(self.jax_mesh.devices.flat)

    def sharding(self, spec: Sequence, shape: Sequence[int]) -> NamedSharding:
        """The NamedSharding of a tensor of `shape` split as `spec`: one entry per
        dim, a mesh axis name (or index, as in torch_xla), a tuple of them, or None
        (whole along that dim); each mesh axis at most once in the spec."""
        if isinstance(spec, str) or not isinstance(spec, (tuple, list)):
            hint = (f"write ({spec!r},) to split dim 0 over it" if isinstance(spec, str)
                    else "write one entry per dim, e.g. ('data', None)")
            raise ValueError(f"xlakit.mark_sharding: the spec {spec!r} is not a tuple of one entry per dim: {hint}")
        spec = tuple(spec)
        if len(spec) != len(shape):
            raise ValueError(f"xlakit.mark_sharding: the spec {spec} has {len(spec)} entries for a tensor of "
                             f"{len(shape)} dims {tuple(shape)}: give one per dim (None = not split)")
        names = [() if entry is None else tuple(self._axis(a, spec) for a in
                                                (entry if isinstance(entry, (tuple, list)) else (entry,)))
                 for entry in spec]
        every = [n for dim in names for n in dim]
        twice = sorted({n for n in every if every.count(n) > 1})
        if twice:
            raise ValueError(f"xlakit.mark_sharding: mesh axis {twice} used twice in {spec}: a mesh axis splits "
                             "one dim, once; name each axis in one entry only")
        sizes = dict(zip(self.axis_names, self.shape))
        for dim, (axes, size) in enumerate(zip(names, shape)):
            pieces = math.prod(sizes[n] for n in axes)
            if size % pieces:
                raise ValueError(f"xlakit.mark_sharding: dim {dim} of size {size} cannot be split into {pieces} "
                                 f"equal pieces over {axes}; pad it or split another dim")
        entries = [None if not axes else axes[0] if len(axes) == 1 else axes for axes in names]
        return NamedSharding(self.jax_mesh, PartitionSpec(*entries))

    def _axis(self, axis, spec: tuple) -> str:
        # bool is an int to Python, never an axis (torch_xla checks `type(axis) is int`)
        if isinstance(axis, int) and not isinstance(axis, bool) and 0 <= axis < len(self.axis_names):
            return self.axis_names[axis]
        if isinstance(axis, str) and axis in self.axis_names:
            return axis
        raise ValueError(
            f"xlakit.mark_sharding: {axis!r} is not an axis of the mesh {self.axis_names} (in the spec {spec}): "
            f"write an axis name, its index (0 to {len(self.axis_names) - 1}), a tuple of them, or None")

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))
        return f"Mesh({axes}; devices {[d.id for d in self.devices]})"


# -- a sharding constraint in the graph -------------------------------------------
class _MarkSharding:
    """The op of a node that only says where its input lives (mark_sharding on a
    pending value); not an aten op: lowerings/to_jax.py lowers it with `constrain`."""

    def __str__(self) -> str:
        return "xlakit.mark_sharding"

    __repr__ = __str__


MARK_SHARDING = _MarkSharding()
MARK_SHARDING_NAME = str(MARK_SHARDING)


@dataclasses.dataclass(frozen=True, eq=False)
class Constraint:
    """The constant argument of a MARK_SHARDING node. Its sharding is in the key's
    `shardings` component, not in the node's signature (the `graph` component)."""

    sharding: NamedSharding
    ndim: int

    def __repr__(self) -> str:
        return spec_text(axes_of(self.sharding, self.ndim))


def constrain(node, operands: list) -> list:
    """A MARK_SHARDING node on tracers."""
    return [jax.lax.with_sharding_constraint(operands[0], node.template[0][1].sharding)]


def constraints(graph: Graph) -> list[tuple[int, NamedSharding]]:
    """(node position, sharding) of each MARK_SHARDING node."""
    return [(i, n.template[0][1].sharding) for i, n in enumerate(graph.nodes) if n.op is MARK_SHARDING]


# -- the placement of a graph ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Placement:
    """A graph that runs on a mesh: each input's sharding, each output's requested
    sharding (None: propagation chooses) and the marks inside it."""

    mesh: jax.sharding.Mesh
    inputs: tuple
    outputs: tuple
    constraints: tuple[tuple[int, NamedSharding], ...]

    def key_bytes(self, graph: Graph) -> bytes:
        """Mesh shape, axis names, device assignment and every partition spec, canonically."""
        param_ndims = [len(a.shape) for a in graph.param_avals]
        root_ndims = [len(a.shape) for a in graph.root_avals]
        return marshal.dumps((
            [_sharding_key(s, n) for s, n in zip(self.inputs, param_ndims)],
            [None if s is None else _sharding_key(s, n) for s, n in zip(self.outputs, root_ndims)],
            [(i, _sharding_key(s, len(graph.nodes[i].avals[0].shape))) for i, s in self.constraints],
        ), 2)

    def devices(self) -> list:
        return list(self.mesh.devices.flat)


def plan(graph: Graph, donors: tuple[int, ...], marks: list | None = None) -> Placement | None:
    """Where `graph` runs: None on one device (no input or mark is on a mesh),
    else on the mesh of its sharded inputs and marks. Inputs not on that mesh
    (new host data, lifted scalars) are replicated over it. An output that
    takes a donated input's buffer keeps that input's sharding (a parameter
    updated in place stays sharded as it was), a marked output its mark's."""
    marks = constraints(graph) if marks is None else marks  # known: a replayed step's (engine/tape.py)
    # data kept on the host (transfer.host_data) has none: replicated where it goes
    shardings = [None if p.array.__class__ is np.ndarray else p.array.sharding for p in graph.params]
    named = [s for s in shardings if isinstance(s, NamedSharding)]
    # the mesh of what is split decides; a replicated input can move to it
    meshes = [s.mesh for s in named if not s.is_fully_replicated] + [s.mesh for _, s in marks] + \
        [s.mesh for s in named]
    if not meshes:
        return None
    mesh = meshes[0]
    replicated = NamedSharding(mesh, PartitionSpec())
    inputs = []
    for i, (p, s) in enumerate(zip(graph.params, shardings)):
        if isinstance(s, NamedSharding) and s.mesh == mesh:
            inputs.append(s)
        elif s is None or s.is_fully_replicated:
            inputs.append(replicated)
        else:
            raise ValueError(
                f"xlakit: one step runs on one mesh, but input {i} ({p.label or p.aval}) is split over "
                f"{_mesh_text(s)} and others over {_mesh_text(NamedSharding(mesh, PartitionSpec()))}: "
                "mark_sharding the tensors of one step on the same xlakit.Mesh")
    for i, s in marks:
        if s.mesh != mesh:
            raise ValueError(f"xlakit: node %{i} marks a sharding over {_mesh_text(s)}, but this step runs over "
                             f"{_mesh_text(replicated)}: mark the tensors of one step on the same xlakit.Mesh")
    marked = {i: s for i, s in marks}
    outputs = []
    for k, (n, _) in enumerate(graph.roots):
        if n in marked:
            outputs.append(marked[n])
        elif k < len(donors):  # stages.plan puts the outputs paired with donors first, in donor order
            outputs.append(inputs[donors[k]])
        else:
            outputs.append(None)
    return Placement(mesh, tuple(inputs), tuple(outputs), tuple(marks))


def arguments(graph: Graph, placement: Placement | None) -> list:
    """The arrays to call the executable with. An input not yet where the
    placement wants it is moved there (transfer.place); device data
    keeps the moved array (one transfer, not one per step), except read-only
    data (cached constants and scalars), which other graphs share."""
    if placement is None:
        return [p.array for p in graph.params]
    arrays = []
    for p, s in zip(graph.params, placement.inputs):
        array = p.array
        if array.__class__ is np.ndarray or not array.sharding.is_equivalent_to(s, array.ndim):
            array = transfer.place(array, s)
            if not p.read_only:
                p.array = array
        arrays.append(array)
    return arrays


# -- shardings as plain data ------------------------------------------------------
def axes_of(sharding, ndim: int) -> tuple[tuple[str, ...], ...] | None:
    """Per dim, the mesh axes a NamedSharding splits it over; None for other shardings."""
    if not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return tuple(() if e is None or e is PartitionSpec.UNCONSTRAINED else (e,) if isinstance(e, str) else tuple(e)
                 for e in spec[:ndim])


def spec_text(axes: tuple[tuple[str, ...], ...] | None) -> str:
    """"('data', None)"; "replicated" when no dim is split."""
    if axes is None:
        return "unknown"
    if not any(axes):
        return "replicated"
    return repr(tuple(None if not a else a[0] if len(a) == 1 else a for a in axes))


def text(sharding, ndim: int) -> str:
    """A sharding in the words of the key and the views."""
    if isinstance(sharding, SingleDeviceSharding):
        return "one device"
    axes = axes_of(sharding, ndim)
    if axes is not None:
        return spec_text(axes)
    if sharding.is_fully_replicated:
        return "replicated"
    return str(sharding._to_xla_hlo_sharding(ndim))


def describe(placement: Placement, compiled, graph: Graph) -> ShardingInfo:
    """The compiled executable's input and output shardings as plain data."""
    mesh = placement.mesh
    info = MeshInfo(shape=tuple(mesh.devices.shape), axis_names=tuple(mesh.axis_names),
                    devices=tuple(d.id for d in mesh.devices.flat))
    inputs = _tensor_shardings(compiled.input_shardings[0], graph.param_avals)
    outputs = _tensor_shardings(compiled.output_shardings, graph.root_avals)
    return ShardingInfo(mesh=info, inputs=inputs, outputs=outputs)


def _tensor_shardings(shardings, avals) -> tuple[TensorSharding, ...]:
    result = []
    for s, aval in zip(jax.tree_util.tree_leaves(shardings), avals):
        shard = tuple(s.shard_shape(aval.shape))
        ndim = len(aval.shape)
        result.append(TensorSharding(
            aval=str(aval), shape=aval.shape, axes=axes_of(s, ndim), spec=text(s, ndim), shard_shape=shard,
            nbytes=aval.nbytes, shard_bytes=aval.dtype.itemsize * math.prod(shard)))
    return tuple(result)


def _sharding_key(sharding, ndim: int) -> tuple:
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        return ("named", tuple(mesh.axis_names), tuple(mesh.devices.shape),
                tuple(d.id for d in mesh.devices.flat), axes_of(sharding, ndim), str(sharding.memory_kind))
    return ("xla", str(sharding._to_xla_hlo_sharding(ndim)), tuple(sorted(d.id for d in sharding.device_set)))


def _mesh_text(sharding: NamedSharding) -> str:
    mesh = sharding.mesh
    return "mesh(" + ", ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.devices.shape)) + \
        f"; devices {[d.id for d in mesh.devices.flat]})"

