"""core/hlo.py, the one reader of an executable's optimized HLO text, on what XLA prints
for small jax functions: fusions, a while loop, a reduce, a conditional, tuples."""
import jax
import jax.numpy as jnp

from xlakit.core import hlo

X = jnp.ones((8, 4), jnp.float32)


def compiled_text(fn, *args, **jit) -> str:
    return jax.jit(fn, **jit).lower(*args).compile().as_text()


def entry(module: hlo.Module) -> hlo.Computation:
    main, = (c for c in module.computations.values() if c.entry)
    return main


def only(module: hlo.Module, opcode: str) -> hlo.Instruction:
    found, = (i for i in module.instructions.values() if i.opcode == opcode)
    return found


def test_a_fusion_its_body_operands_shape_and_metadata():
    module = hlo.parse(compiled_text(lambda a, b: jnp.sin(a) * b + 1, X, X))
    assert module.name.startswith("jit_") and module.attributes["is_scheduled"] == "true"
    main = entry(module)
    root = main.instructions[-1]
    assert root.root and root.opcode == "fusion" and root.computation == main.name
    assert root.shape == "f32[8,4]{1,0}" and root.arrays == (("f32", (8, 4)),) and root.nbytes == 8 * 4 * 4
    parameters = [i for i in main.instructions if i.opcode == "parameter"]
    assert sorted(i.arguments for i in parameters) == ["0", "1"]
    assert sorted(root.operands) == sorted(i.name for i in parameters)
    assert sorted(i.op_name for i in parameters) == ["a", "b"]
    assert root.attributes["kind"] == "kLoop"
    body, = root.called()
    assert root.called("calls") == (body,) and root.called("to_apply") == ()
    fused = module.computations[body]
    assert not fused.entry and {"sine", "multiply", "add"} <= {i.opcode for i in fused.instructions}
    sine = next(i for i in fused.instructions if i.opcode == "sine")
    assert sine.op_name.endswith("/sin") and sine.computation == body
    assert "metadata" not in root.definition and root.definition.startswith("f32[8,4]{1,0} fusion(")
    assert module.instructions[sine.name] is sine


def test_a_while_loop_names_its_condition_and_body():
    module = hlo.parse(compiled_text(lambda a: jax.lax.fori_loop(0, 5, lambda i, c: c * 2 + i, a), X))
    loop = only(module, "while")
    condition, = loop.called("condition")
    body, = loop.called("body")
    assert set(loop.called()) == {condition, body}
    assert module.computations[condition].instructions[-1].shape == "pred[]"
    assert loop.shape.startswith("(") and ("f32", (8, 4)) in loop.arrays
    assert module.computations[body].instructions[-1].opcode == "tuple"
    assert "backend_config" in loop.attributes and "backend_config" not in loop.definition


def test_a_reduce_names_its_reducer():
    module = hlo.parse(compiled_text(lambda a: jnp.sum(a, axis=1), X))
    reduce = only(module, "reduce")
    reducer, = reduce.called("to_apply")
    assert reduce.attributes["dimensions"] == "{1}" and reduce.arrays == (("f32", (8,)),) and reduce.nbytes == 32
    assert module.computations[reducer].instructions[-1].opcode == "add"
    assert len(reduce.operands) == 2


def test_a_conditional_names_its_branches():
    module = hlo.parse(compiled_text(lambda p, a: jax.lax.cond(p > 0, lambda v: v * 2, jnp.sin, a),
                                     jnp.float32(1), X))
    conditional = only(module, "conditional")
    branches = conditional.called("branch_computations")
    assert len(branches) == 2 and all(b in module.computations for b in branches)
    assert conditional.called() == branches and len(conditional.operands) == 3


def test_tuple_results_with_and_without_index_comments():
    module = hlo.parse(compiled_text(lambda a: (a + 1, a.astype(jnp.int32), a.sum()), X))
    root = entry(module).instructions[-1]
    assert root.opcode == "tuple" and len(root.operands) == 3
    assert root.arrays == (("f32", (8, 4)), ("s32", (8, 4)), ("f32", ()))
    assert root.nbytes == 128 + 128 + 4
    # seven outputs: XLA prints /*index=5*/ inside the shape and the operands
    seven = [jnp.ones(i + 1, jnp.float32) for i in range(7)]
    root = entry(hlo.parse(compiled_text(lambda *a: tuple(v * 2 for v in a), *seven))).instructions[-1]
    assert "/*index=5*/" in root.shape and root.opcode == "tuple" and len(root.operands) == 7
    assert root.arrays == tuple(("f32", (i + 1,)) for i in range(7)) and root.nbytes == 4 * 28


def test_the_header_names_the_module_and_its_aliases():
    module = hlo.parse(compiled_text(lambda a, b: (a + b, b * 2), X, X, donate_argnums=(1,)))
    assert module.output_aliases in ({0: 1}, {1: 1})
    assert "entry_computation_layout" in module.attributes
    assert hlo.parse("HloModule jit_f, entry_computation_layout={}").output_aliases == {}


def test_parsed_once_per_text():
    text = compiled_text(lambda a: a * 3, X)
    assert hlo.parse(text) is hlo.parse(text)
    empty = hlo.parse(None)
    assert empty.name == "" and not empty.computations and not empty.instructions


def test_group_sizes_and_loose_lines():
    """Lines outside any computation (a fragment) are read too; a collective's group size, from
    each notation XLA prints."""
    module = hlo.parse("""
  %a = f32[] all-reduce(%x), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%sum
  %b = f32[] all-reduce(%x), replica_groups=[4,2]<=[2,4]T(1,0)
  %c = f32[] all-reduce(%x), replica_groups=mesh['a'=2,'b'=4] {'b'}, to_apply=%sum
  %d = f32[8]{0} all-gather(%x), replica_groups=mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'a'}, dimensions={0}
  %e = f32[2]{0} collective-permute(%x), source_target_pairs={{0,1},{1,0}}
  %f = f32[2]{0} add(%e, %e), metadata={op_name="jit(f)/add, x=\\"y\\"" source_line=3}
""")
    assert list(module.computations) == [""]
    assert [i.group_size for i in module.instructions.values()] == [4, 2, 4, 2, 2, None]
    add = module.instructions["f"]
    assert add.operands == ("e", "e") and add.metadata["source_line"] == "3"
    assert add.op_name == 'jit(f)/add, x=\\"y\\"'  # as printed, escapes kept
