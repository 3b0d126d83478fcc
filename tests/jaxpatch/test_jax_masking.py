"""The JAX masking patch, tested in two venvs by `make patches-jax-check`:

XLA_HARNESS_JAX_VARIANT=stock    .venv (PyPI jax 0.12.0.1; JAX_PIN=v: .venv-jaxv): the
                                 where-guard NaN is real, and the stock gradients of the
                                 registry are recorded;
XLA_HARNESS_JAX_VARIANT=patched  .venv-jax-patched (.venv-jaxv-patched; same jaxlib, jax sdist +
                                 patch 0001, the series' variant for that jax): flag off is
                                 bit-identical to stock; flag on gives exact zeros.
XLA_HARNESS_JAX_PIN              the jax version both venvs must run (default 0.12.0.1).

Without the variable (a plain `pytest`) these tests are skipped: they are only meaningful
against a known jax build, and the make target runs them in both.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_harness.gradcheck import check
from xla_harness.gradcheck.cases import REGISTRY

VARIANT = os.environ.get("XLA_HARNESS_JAX_VARIANT")
STOCK = os.environ.get("XLA_HARNESS_STOCK_GRADS", "")
PIN = os.environ.get("XLA_HARNESS_JAX_PIN", "0.12.0.1")  # the jax both venvs must run (make's JAX_PIN)
pytestmark = pytest.mark.skipif(VARIANT is None, reason="run by `make patches-jax-check` in both venvs")

GUARDS = [c for c in REGISTRY if c.kind == "where-guard"]
CORPUS = [c for c in REGISTRY if c.kind != "where-guard"]
patched_only = pytest.mark.skipif(VARIANT != "patched", reason="patched venv only")
stock_only = pytest.mark.skipif(VARIANT != "stock", reason="stock venv only")


@pytest.fixture
def masking():
    jax.config.update("jax_zero_cotangent_masking", True)
    yield
    jax.config.update("jax_zero_cotangent_masking", False)


def _grads(case, mode="eager"):
    if not case.reverse:
        mode = "jvp"
    return check.gradient(case, mode, np.asarray(case.points))


def test_variant_is_the_jax_under_test():
    assert VARIANT in ("stock", "patched")
    assert hasattr(jax.lax, "masked_scale") == (VARIANT == "patched")
    assert jax.__version__ == PIN


@stock_only
@pytest.mark.parametrize("case", GUARDS, ids=lambda c: c.name)
def test_stock_where_guards_leak_nan(case):
    for mode in ("eager", "jit"):
        g = _grads(case, mode)
        assert np.isnan(g).any(), f"{case.name} {mode}: expected the NaN leak, got {g}"


@stock_only
def test_record_stock_gradients():
    assert STOCK, "XLA_HARNESS_STOCK_GRADS must name the file to write"
    grads = {c.name: _grads(c) for c in REGISTRY}
    assert len(grads) >= 50
    os.makedirs(os.path.dirname(STOCK) or ".", exist_ok=True)
    np.savez(STOCK, **grads)


@patched_only
def test_flag_off_is_bit_identical_to_stock():
    stock = np.load(STOCK)
    assert len(stock.files) >= 50
    assert not jax.config.jax_zero_cotangent_masking
    for c in REGISTRY:
        got = _grads(c)
        assert np.array_equal(got, stock[c.name], equal_nan=True), (c.name, got, stock[c.name])


@patched_only
@pytest.mark.parametrize("case", GUARDS, ids=lambda c: c.name)
def test_flag_on_where_guards_are_exact(case, masking):
    for mode in ("eager", "jit", "vjp", "jvp"):
        g = _grads(case, mode)
        assert np.all(np.isfinite(g)), (case.name, mode, g)
        np.testing.assert_allclose(g, case.expected, rtol=1e-6, atol=1e-6)
        dead = np.asarray(case.dead)
        assert np.all(g[dead] == 0.0), (case.name, mode, g)  # exact zeros, not tiny numbers


@patched_only
def test_flag_on_ordinary_points_within_one_ulp_of_stock(masking):
    stock = np.load(STOCK)
    for c in CORPUS:
        got = _grads(c)
        ref = stock[c.name]
        ulp = np.spacing(np.abs(ref).astype(np.float32))
        assert np.all(np.abs(got - ref) <= ulp), (c.name, got, ref)


@patched_only
def test_flag_on_agrees_with_float64_finite_differences(masking):
    for c in REGISTRY:
        if not c.smooth:
            continue
        smooth = np.asarray(c.smooth)
        got = _grads(c)
        fd = check.finite_differences(c, np.asarray(c.points))
        np.testing.assert_allclose(got[smooth], fd[smooth], rtol=2e-3, atol=1e-5, err_msg=c.name)


@patched_only
def test_second_order_and_jvp_of_grad(masking):
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0)  # noqa: E731
    x = jnp.array([-1.0, 0.0, 4.0])
    g2 = jax.vmap(jax.grad(jax.grad(f)))(x)
    np.testing.assert_allclose(g2, [0.0, 0.0, -1.0 / 32.0])
    _, t = jax.jvp(jax.vmap(jax.grad(f)), (x,), (jnp.ones(3),))
    np.testing.assert_allclose(t, [0.0, 0.0, -1.0 / 32.0])


@patched_only
def test_shard_map_on_two_cpu_devices(masking):
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    assert jax.device_count() >= 2
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0)  # noqa: E731
    g = jax.jit(jax.shard_map(jax.vmap(jax.grad(f)), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    np.testing.assert_array_equal(g(jnp.array([-1.0, 0.0, 1.0, 4.0])), [0.0, 0.0, 0.5, 0.25])


@patched_only
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_low_precision_dtypes(dtype, masking):
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), jnp.zeros_like(x))  # noqa: E731
    g = jax.vmap(jax.grad(f))(jnp.array([-1.0, 0.0, 1.0, 4.0], dtype))
    assert g.dtype == dtype
    np.testing.assert_array_equal(np.asarray(g, np.float32), [0.0, 0.0, 0.5, 0.25])


@patched_only
def test_complex_and_primitive_rules():
    t = jnp.array([0.0 + 0.0j, 1.0 + 2.0j], jnp.complex64)
    d = jnp.array([np.inf + 0j, 2.0 + 0j], jnp.complex64)
    np.testing.assert_array_equal(jax.lax.masked_scale(t, d), [0.0, 2.0 + 4.0j])
    tr = jnp.array([0.0, 3.0])
    np.testing.assert_array_equal(jax.lax.masked_scale(tr, jnp.array([0.0, 2.0]), op="div"), [0.0, 1.5])
    with pytest.raises(ValueError):
        jax.lax.masked_scale(tr, tr, op="add")
    hlo = jax.jit(lambda a, b: jax.lax.masked_scale(a, b)).lower(tr, tr).as_text()
    assert "select" in hlo and "compare" in hlo


# --- higher orders, vmap and sharding: flag on against flag off (the stock rules) ----------------

def _layernorm_loss(x):
    mu = jnp.mean(x)
    var = jnp.mean((x - mu) ** 2)
    return jnp.sum(jnp.log1p(jnp.abs((x - mu) * jax.lax.rsqrt(var + 1e-5))))


SCALAR_LOSSES = {
    "sum_log": lambda x: jnp.sum(jnp.log(x)),
    "sum_sqrt": lambda x: jnp.sum(jnp.sqrt(x)),
    "sum_reciprocal": lambda x: jnp.sum(1.0 / x),
    "sum_pow_neg": lambda x: jnp.sum(x**-2),
    "logsumexp": jax.nn.logsumexp,
    "norm": jnp.linalg.norm,
    "layernorm": _layernorm_loss,
}
SECOND_ORDER = {
    "hessian": jax.hessian,
    "jacfwd_grad": lambda f: jax.jacfwd(jax.grad(f)),
    "jacrev_jacrev": lambda f: jax.jacrev(jax.jacrev(f)),
    "jacfwd_jacrev": lambda f: jax.jacfwd(jax.jacrev(f)),
}


def _off_and_on(fn, *args):
    with jax.zero_cotangent_masking(False):
        off = np.asarray(fn(*args))
    with jax.zero_cotangent_masking(True):
        on = np.asarray(fn(*args))
    return off, on


@patched_only
@pytest.mark.parametrize("order", SECOND_ORDER, ids=str)
@pytest.mark.parametrize("loss", SCALAR_LOSSES, ids=str)
def test_second_order_at_ordinary_points_matches_flag_off(loss, order):
    x = np.array([0.5, 1.25, 2.0, 3.5], np.float32)
    off, on = _off_and_on(SECOND_ORDER[order](SCALAR_LOSSES[loss]), x)
    assert on.shape == off.shape == (4, 4)
    assert np.all(np.isfinite(off)), off
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-6)


def _mlp_loss(w, x):
    h = jnp.sqrt(jnp.square(w @ x) + 1.0)  # size-(4,) hidden layer, masked sqrt rule
    return jnp.log(jnp.sum(h)) + jnp.sum(1.0 / (h + x[:2].sum())) + _layernorm_loss(h)


@patched_only
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_per_example_gradients_match_flag_off_and_a_loop(jit):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    xs = rng.normal(size=(5, 3)).astype(np.float32)
    per_example = jax.vmap(jax.grad(_mlp_loss), (None, 0))
    per_example = jax.jit(per_example) if jit else per_example
    off, on = _off_and_on(per_example, w, xs)
    assert on.shape == (5, 4, 3)
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-6)
    with jax.zero_cotangent_masking(True):
        loop = np.stack([np.asarray(jax.grad(_mlp_loss)(w, x)) for x in xs])
    np.testing.assert_allclose(on, loop, rtol=1e-5, atol=1e-6)


@patched_only
@pytest.mark.parametrize("op", ["mul", "div"])
@pytest.mark.parametrize("t_shape,d_shape", [((3, 1), (3, 4)), ((1, 4), (3, 1)), ((3, 4), (1, 4))])
def test_masked_scale_broadcasts_size1_dims_like_numpy(op, t_shape, d_shape):
    rng = np.random.default_rng(1)
    t = rng.choice(np.array([0.0, 1.5, -2.0, np.inf], np.float32), size=t_shape)
    d = rng.choice(np.array([0.0, 2.0, np.inf, -0.5], np.float32), size=d_shape)
    if op == "div":
        d = np.where(d == 0, np.float32(4.0), d)
    bt, bd = np.broadcast_arrays(t, d)
    # Only a zero t is masked: an infinite t times a zero d stays NaN.
    with np.errstate(invalid="ignore"):
        want = np.where(bt == 0, 0, bt * bd) if op == "mul" else np.where(bt == 0, 0, bt / bd)
    for fn in (jax.lax.masked_scale, jax.jit(jax.lax.masked_scale, static_argnames="op")):
        got = np.asarray(fn(t, d, op=op))
        assert got.shape == (3, 4)
        np.testing.assert_array_equal(got, want.astype(np.float32))
    # The transpose sums the cotangent back over the broadcast dimensions of t.
    t = np.where(np.isinf(t), np.float32(3.0), t)
    ct = jax.grad(lambda t: jnp.sum(jax.lax.masked_scale(t, np.where(np.isinf(d), 1.0, d), op=op)))(t)
    assert ct.shape == t_shape
    dd = np.broadcast_to(np.where(np.isinf(d), 1.0, d), (3, 4))
    np.testing.assert_allclose(ct, np.sum(dd if op == "mul" else 1.0 / dd, axis=tuple(
        i for i, n in enumerate(t_shape) if n == 1), keepdims=True), rtol=1e-6)


@patched_only
def test_zero_factor_does_not_win_over_an_infinite_tangent():
    # squareplus at -inf: the tangent of x**2 is -inf and sqrt's factor 0.5 / sqrt(inf) is 0. Stock
    # gives NaN in both modes (jax's nn_test testSquareplusGradNegInf asserts it); so must the flag.
    f = jax.nn.squareplus
    for flag in (False, True):
        with jax.zero_cotangent_masking(flag):
            assert np.isnan(jax.jvp(f, (-jnp.inf,), (1.0,))[1]), flag
            assert np.isnan(jax.grad(f)(-jnp.inf)), flag
            assert float(jax.jvp(f, (0.0,), (1.0,))[1]) == 0.5
    t = jnp.array([0.0, jnp.inf])
    with jax.zero_cotangent_masking(True):
        np.testing.assert_array_equal(jax.lax.masked_scale(t, jnp.zeros(2)), [0.0, np.nan])


GUARDED_POINTS = {
    # name: (f, point where the guarded branch is dead and its derivatives infinite or NaN)
    "sqrt": (lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0), 0.0),
    "rsqrt": (lambda x: jnp.where(x > 0, jax.lax.rsqrt(x), 0.0), 0.0),
    "cbrt": (lambda x: jnp.where(x > 0, jnp.cbrt(x), 0.0), 0.0),
    "log": (lambda x: jnp.where(x > 0, jnp.log(x), 0.0), 0.0),
    "div": (lambda x: jnp.where(x > 0, 1.0 / x, 0.0), 0.0),
    "reciprocal": (lambda x: jnp.where(x > 0, jnp.reciprocal(x), 0.0), 0.0),
    "integer_pow_neg": (lambda x: jnp.where(x > 0, x**-1, 0.0), 0.0),
    "pow_half": (lambda x: jnp.where(x > 0, x**0.5, 0.0), 0.0),
    "atanh": (lambda x: jnp.where(x < 1, jnp.arctanh(x), 0.0), 1.0),
    "acosh": (lambda x: jnp.where(x > 1, jnp.arccosh(x), 0.0), 1.0),
    "log1p": (lambda x: jnp.where(x > -1, jnp.log1p(x), 0.0), -1.0),
    "asin": (lambda x: jnp.where(x < 1, jnp.arcsin(x), 0.0), 1.0),
}


@patched_only
@pytest.mark.parametrize("name", GUARDED_POINTS, ids=str)
def test_grad_grad_at_guarded_points_is_zero_in_both_modes(name):
    f, x0 = GUARDED_POINTS[name]
    x0 = np.float32(x0)
    d2 = {"grad_grad": jax.grad(jax.grad(f)), "jacfwd_grad": jax.jacfwd(jax.grad(f)),
          "jacrev_grad": jax.jacrev(jax.grad(f)), "jit_grad_grad": jax.jit(jax.grad(jax.grad(f)))}
    with jax.zero_cotangent_masking(True):
        assert float(jax.grad(f)(x0)) == 0.0
        for mode, fn in d2.items():
            assert float(fn(x0)) == 0.0, (name, mode, fn(x0))
    with jax.zero_cotangent_masking(False):
        assert np.isnan(float(jax.grad(f)(x0))), f"{name}: stock first derivative at {x0} is expected to be NaN"


@patched_only
def test_third_order_at_the_guarded_point():
    f, _ = GUARDED_POINTS["sqrt"]
    d3 = jax.grad(jax.grad(jax.grad(f)))
    with jax.zero_cotangent_masking(True):
        assert float(d3(0.0)) == 0.0
        np.testing.assert_allclose(float(d3(4.0)), 3.0 / 8.0 * 4.0**-2.5, rtol=1e-6)
    with jax.zero_cotangent_masking(False):
        assert np.isnan(float(d3(0.0)))


UNREDUCED_SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, PartitionSpec as P

assert jax.device_count() == 8, jax.devices()
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))

def f(x, y):  # x is reduced over "x": its cotangent is unreduced and meets the masked rules
    h = jax.lax.select(x > 0, jnp.sqrt(x), jnp.zeros_like(x)) + jnp.log(x * x + 1.0)
    return (h @ jnp.sqrt(y + 1.0)).sum()

x = np.array([[-1.0, 0.0], [1.0, 4.0], [0.0, 2.0], [9.0, -3.0]], np.float32)
y = np.arange(16.0, dtype=np.float32).reshape(2, 8)
out = {}
for flag in (False, True):
    with jax.zero_cotangent_masking(flag):
        single = jax.grad(f, argnums=(0, 1))(x, y)
        with jax.set_mesh(mesh):
            try:
                gx, gy = jax.jit(jax.grad(f, argnums=(0, 1)))(
                    jax.device_put(x, P(reduced={"x"})), jax.device_put(y, P(None, "x")))
            except NotImplementedError as exc:  # the stock rules (flag off) lack a sharding rule
                if flag:
                    raise
                json.dump({"stock_cannot": str(exc)}, sys.stdout)
                sys.exit(0)
            out[str(flag)] = {
                "gx_spec": str(gx.sharding.spec), "gx": np.asarray(jax.reshard(gx, P())).tolist(),
                "gy": np.asarray(gy).tolist(),
                "single_gx": np.asarray(single[0]).tolist(), "single_gy": np.asarray(single[1]).tolist()}
json.dump(out, sys.stdout)
"""


@patched_only
@pytest.mark.slow
def test_unreduced_cotangents_on_eight_cpu_devices():
    import json
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-c", UNREDUCED_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    if "stock_cannot" in out:
        # jax 0.9.0.1: "reduced rule for select_n is not implemented", with the flag off (the stock
        # rules): that jax cannot run the program at all. The default pin must run it.
        assert PIN != "0.12.0.1", out["stock_cannot"]
        pytest.skip(f"jax {jax.__version__} cannot run this program with the flag off: {out['stock_cannot']}")
    for flag in ("False", "True"):
        r = out[flag]
        assert "unreduced={'x'}" in r["gx_spec"], r["gx_spec"]
        # the sharded gradient (unreduced partial sums, then summed) equals the single-device one
        np.testing.assert_allclose(r["gx"], r["single_gx"], rtol=1e-5)
        np.testing.assert_allclose(r["gy"], r["single_gy"], rtol=1e-5)
    dead = np.array([[True, True], [False, False], [True, False], [False, True]])
    off, on = np.array(out["False"]["gx"]), np.array(out["True"]["gx"])
    assert np.all(np.isnan(off[dead])) and np.all(np.isfinite(off[~dead]))
    assert np.all(np.isfinite(on))
    np.testing.assert_allclose(on[~dead], off[~dead], rtol=1e-5)


@patched_only
def test_pow_with_integer_exponents_matches_flag_off():
    # The masked pow rule keeps the stock rule's dtype promotion and broadcasting (int y, float x).
    x = jnp.arange(4, dtype=jnp.float32)
    fns = {
        "int_power_at_zero": lambda: jax.grad(jax.jit(lambda x, n: x**n))(0.0, 0),
        "jacrev_int_scalar_y": lambda: jax.jacrev(jax.jit(jax.lax.pow))(x, 2),
        "int_powers_vector": lambda: jax.grad(lambda z: jnp.sum(jax.lax.pow(z, jnp.arange(0, 2))))(2.0),
    }
    for name, fn in fns.items():
        off, on = _off_and_on(fn)
        np.testing.assert_array_equal(on, off, err_msg=name)
    np.testing.assert_array_equal(fns["jacrev_int_scalar_y"](), np.diag(2 * np.arange(4.0)))
