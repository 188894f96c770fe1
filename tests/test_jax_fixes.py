"""xlakit/lowerings/jax_fixes.py: where jax has the defect, the fix is in once the lazy device is
(tests/test_architecture.py: not at import) and lowers right; where it has not (jax 0.10), nothing
is touched. Only the Colab column's jax 0.7.2 has it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import core
from jax._src.interpreters import mlir

import xlakit

HAS_CACHE = hasattr(mlir, "HashableLiteral")
CONSTANTS = [0.0, -0.0, *(k / 8 for k in range(-30, 30) if k)]


def _many_literals(x):
    return [x * c for c in CONSTANTS] + [x * CONSTANTS[5]]   # one repeated: the cache serves it


@pytest.mark.skipif(not HAS_CACHE, reason="this jax's lowering has no literal cache")
def test_equal_literals_hash_equal_and_signed_zeros_stay_apart():
    xlakit.device()   # installs the fix
    jaxpr = jax.make_jaxpr(_many_literals)(jnp.ones(3, jnp.float32)).jaxpr
    literals = [v for eqn in jaxpr.eqns for v in eqn.invars if type(v) is core.Literal]
    hashed = [mlir.HashableLiteral(v) for v in literals]
    assert all(h.data is not None for h in hashed)   # the defect: every LiteralArray's was None
    assert hashed[-1] == hashed[5] and hash(hashed[-1]) == hash(hashed[5])
    assert hashed[0] != hashed[1]   # 0.0 and -0.0: the cache must not merge them
    assert len(set(hashed)) == len(CONSTANTS)


def test_a_jaxpr_of_many_literals_lowers_to_its_values():
    xlakit.device()
    x = np.array([1.0, -2.0, 0.5], np.float32)
    got = jax.jit(_many_literals)(x)
    for value, c in zip(got, CONSTANTS + [CONSTANTS[5]]):
        want = x * np.float32(c)
        np.testing.assert_array_equal(np.asarray(value), want)
        np.testing.assert_array_equal(np.signbit(np.asarray(value)), np.signbit(want))
