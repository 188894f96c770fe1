"""FLOPs per op and per module, estimated from each node's op and shapes.

XLA's cost analysis (StepRecord.cost) counts the whole compiled executable, after
fusion; it cannot say which module a FLOP came from. This counts each recorded
op, so a step's FLOPs can be split by module and by op: matmuls, convolutions
and attention by torch's own formulas (torch.utils.flop_counter: 2·m·n·k),
`_grouped_mm` as its groups' products (2·m·n·k summed over the groups: the
same for any group sizes, where XLA's CPU count of a ragged dot is the dense
product per group), reductions one per input element, data movement (views,
copies, gathers, factories) none, every other op one per output element.
torch_xla's IR names its ops "aten::mm" and orders some operands its own way
(its addmm is input, weight, bias): its matmuls count by the same 2·m·n·k.
Estimates, shown beside XLA's total.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
from collections import Counter, defaultdict

import torch
from torch.utils.flop_counter import flop_registry

from ..core.record import GraphInfo, NodeInfo
from ..core.state import PROCESS
from .footprint import aval_shape, short_op

# ops that move or make data without arithmetic; functionalized views are `*_copy`
_DATA_MOVEMENT = frozenset("""
    view _unsafe_view reshape t transpose permute expand squeeze unsqueeze slice select narrow alias detach
    clone copy contiguous cat stack split unbind chunk index_select gather scatter embedding index index_put
    _unsafe_index take masked_select nonzero lift_fresh zeros ones full empty arange linspace scalar_tensor
    zeros_like ones_like full_like empty_like new_zeros new_ones new_full new_empty empty_strided fill
    constant_pad_nd pad repeat roll flip diagonal as_strided unfold tril triu rand randn randint rand_like
    randn_like bernoulli uniform normal native_dropout _to_copy to _assert_async sym_size
    Constant
""".split())  # Constant: torch_xla's prim::Constant
_REDUCTIONS = frozenset("""
    sum mean amax amin max min prod var std var_mean std_mean norm linalg_vector_norm logsumexp argmax
    argmin all any cumsum cumprod count_nonzero mse_loss l1_loss smooth_l1_loss huber_loss nll_loss
    binary_cross_entropy binary_cross_entropy_with_logits
""".split())
_OPERAND = re.compile(r"\$(\d+)")  # how NodeInfo.args writes operand i
# matmuls torch has no FLOP formula for: the operand that holds k (after a bias, 1)
_OTHER_MATMULS = {"matmul": 0, "mv": 0, "dot": 0, "linear": 0, "addmv": 1, "addbmm": 1}
# torch_xla IR's matmuls ("aten::addmm(input, weight, bias)"): the operand whose last dim is k
_TORCH_XLA_MATMULS = {"mm": 0, "matmul": 0, "bmm": 0, "addmm": 0, "baddbmm": 1}


def node_flops(graph: GraphInfo, node: NodeInfo) -> float:
    """Estimated floating-point operations of one node (see the module docstring)."""
    return _estimate(node.op, node.avals, tuple(_operand_aval(graph, o) for o in node.operands), node.args)


@functools.lru_cache(maxsize=1 << 16)  # a model repeats its layers, and a cache hit redraws the same graph
def _estimate(op: str, avals: tuple[str, ...], operand_avals: tuple[str | None, ...], args: str) -> float:
    outs = [aval_shape(a) for a in avals]
    ins = [aval_shape(a) for a in operand_avals]
    formula = _formula(op)
    if formula is not None and None not in ins:
        try:
            positional, keywords = _call_args(args, ins)
            return float(formula(*positional, out_val=outs[0] if len(outs) == 1 else tuple(outs), **keywords))
        except Exception:  # noqa: BLE001 - arguments it cannot read: counted by the rules below
            pass
    name = short_op(op).removesuffix("_")
    out = outs[0] if outs else None
    if name == "_grouped_mm" and out is not None and len(ins) > 1 and None not in ins[:2]:
        # a ragged dot: each row of self (2-D x 2-D: each column) is in one group, whatever the group
        # sizes; 2-D x 2-D's output holds a product per group over its share of the contraction
        groups = out[0] if len(ins[0]) == len(ins[1]) == 2 else 1
        return 2.0 * math.prod(out) * ins[0][-1] / groups
    matmuls = _TORCH_XLA_MATMULS if "::" in op else _OTHER_MATMULS
    if name in matmuls and out is not None:
        k_from = ins[matmuls[name]] if len(ins) > matmuls[name] else None
        return 2.0 * math.prod(out) * (k_from[-1] if k_from else 1)
    if name in _DATA_MOVEMENT or name.endswith("_copy") or out is None:
        return 0.0
    if name in _REDUCTIONS and ins and ins[0] is not None:
        return float(math.prod(ins[0]))
    return float(sum(math.prod(s) for s in outs if s is not None))


PROCESS.keep("analysis.flops: estimates", _estimate, bound=_estimate.cache_info().maxsize,
             why="per (op, avals, arguments), its FLOPs", clear=_estimate.cache_clear,
             size=lambda: _estimate.cache_info().currsize)


def _formula(op: str):
    """torch's FLOP formula for an op (matmuls, convolutions, attention), if it has one."""
    namespace, _, rest = op.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), rest.split(".")[0])
    except (AttributeError, RuntimeError):
        return None
    return flop_registry.get(packet)


def _operand_aval(graph: GraphInfo, operand) -> str | None:
    if isinstance(operand, int):
        return graph.params[operand].aval if operand < len(graph.params) else None
    node = graph.nodes[operand.node]
    return node.avals[operand.output] if operand.output < len(node.avals) else None


def _call_args(text: str, shapes: list) -> tuple[list, dict]:
    """A node's arguments ("$0, $1, [1, 1], False, alpha=$2") as Python values, each
    operand as its shape: what torch's FLOP formulas read."""
    call = ast.parse("f(" + _OPERAND.sub(r"__operand_\1", text) + ")", mode="eval").body

    def value(expr):
        if isinstance(expr, ast.Name) and expr.id.startswith("__operand_"):
            return torch.Size(shapes[int(expr.id.removeprefix("__operand_"))])
        try:
            return ast.literal_eval(expr)
        except ValueError:  # torch.float32, torch.preserve_format, ...: no formula reads them
            return None

    return [value(a) for a in call.args], {k.arg: value(k.value) for k in call.keywords}


@dataclasses.dataclass
class ModuleCost:
    """Estimated FLOPs of the ops one module recorded, its submodules' included.
    A module's backward ops (module path "backward.<path>") count toward it, apart
    in `backward`."""

    path: str                      # "model.layers.3.self_attn"; "" for the whole step
    ops: int = 0
    flops: float = 0.0
    backward: float = 0.0
    children: dict[str, ModuleCost] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path else "(whole step)"


def by_module(graph: GraphInfo) -> ModuleCost:
    """The module tree of a step with each module's estimated FLOPs. A node with
    no module (NodeInfo.module == "") counts only toward the whole step."""
    root = ModuleCost("")
    for node in graph.nodes:
        flops = node_flops(graph, node)
        backward = node.module == "backward" or node.module.startswith("backward.")
        path = node.module.removeprefix("backward").removeprefix(".") if backward else node.module
        here = root
        for part in ([] if not path else path.split(".")):
            child_path = f"{here.path}.{part}" if here.path else part
            here = here.children.setdefault(part, ModuleCost(child_path))
            _add(here, flops, backward)
        _add(root, flops, backward)
    return root


def _add(cost: ModuleCost, flops: float, backward: bool) -> None:
    cost.ops += 1
    cost.flops += flops
    if backward:
        cost.backward += flops


def by_op(graph: GraphInfo) -> list[tuple[str, int, float]]:
    """(op, count, estimated FLOPs) per op name, most FLOPs first."""
    counts, flops = Counter(), defaultdict(float)
    for node in graph.nodes:
        name = short_op(node.op)
        counts[name] += 1
        flops[name] += node_flops(graph, node)
    return sorted(((op, counts[op], flops[op]) for op in counts), key=lambda row: (-row[2], row[0]))
