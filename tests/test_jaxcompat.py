"""xla_harness.jaxcompat: the shims give on every supported jax what the newest jax gives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from xla_harness import jaxcompat


@pytest.fixture(scope="module")
def mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py splits the host platform)")
    return jax.make_mesh((2, 4), ("model", "data"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:8])


def test_one_hot_with_out_sharding_on_an_explicit_mesh(mesh):
    """The fallback of jax < 0.11 (an iota sharded on the class axis) and jax's own out_sharding=:
    same values, same sharding; the public shim takes whichever this jax has."""
    tgt = jax.device_put(jax.random.randint(jax.random.key(0), (8, 5), 0, 16), NamedSharding(mesh, P("data", None)))
    out = NamedSharding(mesh, P("data", None, "model"))
    want = np.eye(16, dtype=np.float32)[np.asarray(tgt)]
    fns = {"fallback": lambda t: jaxcompat._one_hot_explicit(t, 16, jnp.float32, out),
           "shim": lambda t: jaxcompat.one_hot(t, 16, dtype=jnp.float32, out_sharding=out)}
    if jaxcompat.one_hot_takes_out_sharding():
        fns["jax"] = lambda t: jax.nn.one_hot(t, 16, dtype=jnp.float32, out_sharding=out)
    for name, fn in fns.items():
        got = jax.jit(fn)(tgt)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=name)
        assert got.sharding.spec == P("data", None, "model"), (name, got.sharding.spec)


def test_one_hot_without_out_sharding_is_jax_own():
    x = jnp.array([0, 2, 5])
    np.testing.assert_array_equal(jaxcompat.one_hot(x, 4), jax.nn.one_hot(x, 4))


def test_xla_hlo_parser_is_found():
    module = jaxcompat.xla_hlo()
    assert module is not None, "jaxlib exposes no hlo_module_from_text"
    text = module.hlo_module_from_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[2]{0} parameter(0)\n}\n").to_string()
    assert "parameter(0)" in text


def test_compiled_call_is_what_compiled_forwards_to_and_the_step_calls_it():
    """After its first call a Compiled forwards every call to one callable; the proven step calls that
    one directly (Compiled.__call__ runs once), gives the same results, and a jax that keeps no such
    callable gets the Compiled itself."""
    import jax.numpy as jnp
    from jax import stages

    from xla_harness.jaxcompat import compiled_call
    from xla_harness.stress.proof.same_program import ProvenStep

    def step(p, o, b):
        return p + b, o, {"loss": jnp.sum(p)}

    jitted = jax.jit(step)
    proven = ProvenStep(jitted, lambda: jax.jit(lambda *a: step(*a)), "t")
    args = (jnp.ones(3), jnp.zeros(()), jnp.ones(3))
    proven.prove(args, args, ("sig",))
    calls = []
    real = stages.Compiled.__call__

    def counted(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    stages.Compiled.__call__ = counted
    try:
        outs = [proven(*args)[0] for _ in range(3)]
    finally:
        stages.Compiled.__call__ = real
    assert len(calls) == 1 and all((o == 2).all() for o in outs)
    assert compiled_call(proven.current) is proven.current._call

    class NoFastPath:
        def __call__(self, *a):
            return a

    keeps_none = NoFastPath()
    assert compiled_call(keeps_none) is keeps_none
