"""TensorFlow and MLX against the one registry, run by `make frameworks-test` in
.venv-frameworks (tensorflow-cpu 2.21.0, mlx[cpu] 0.32.4, jax), with the op library of
patches/tensorflow/0001 built by `make tf-oplib` (XLA_HARNESS_TF_OPLIB) and its control, the
same library built from the lines the patch replaces (XLA_HARNESS_TF_OPLIB_STOCK).

Without XLA_HARNESS_FRAMEWORKS_VENV (a plain `pytest` in .venv) these are skipped: the
make target runs them where the frameworks are installed.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xla_harness.gradcheck import cross
from xla_harness.gradcheck.cases import REGISTRY, by_name
from xla_harness.gradcheck.tf_oplib import control
from xla_harness.gradcheck.tf_oplib.build import PATCH, added_lines

# slow: TensorFlow and MLX runs, some in subprocesses (TF itself asks `uname -p` on import).
pytestmark = [pytest.mark.skipif(not os.environ.get("XLA_HARNESS_FRAMEWORKS_VENV"),
                                 reason="run by `make frameworks-test` in .venv-frameworks"),
              pytest.mark.slow]
CASES = by_name()


@pytest.fixture(scope="module", autouse=True)
def _both_op_libraries_before_the_first_xla_compilation():
    """XLA registers the JIT kernels of loaded op libraries once, at the first compilation."""
    _stock_lib()


def _tf(name, mode):
    from xla_harness.gradcheck.frameworks import tf_adapter

    case = CASES[name]
    return tf_adapter.gradient(case, mode, np.asarray(case.points))


def test_the_reported_tf_table_is_reproduced():
    """where(x > 0, sqrt(x), 0) etc. at x = [-1, 0, 1, 4]: eager/graph fine, XLA NaN."""
    for name, live in (("where_sqrt", [0.5, 0.25]), ("where_rsqrt", [-0.5, -0.0625])):
        for mode in ("eager", "graph"):
            np.testing.assert_array_equal(_tf(name, mode), [0, 0, *live])
        xla = _tf(name, "jit_compile")
        assert np.isnan(xla[:2]).all() and np.allclose(xla[2:], live)
    # 1 / x is RealDiv, whose gradient no kernel guards: NaN at 0 in every mode.
    for mode in ("eager", "graph", "jit_compile"):
        g = _tf("where_reciprocal", mode)
        assert np.isnan(g[1]) and g[0] == 0 and np.allclose(g[2:], [-1, -0.0625])


def test_mlx_leaks_and_3633_no_longer_reproduces():
    from xla_harness.gradcheck.frameworks import mlx_adapter

    case = CASES["where_sqrt"]
    for mode in mlx_adapter.MODES:
        g = mlx_adapter.gradient(case, mode, np.asarray(case.points))
        assert np.isnan(g[:2]).all() and np.allclose(g[2:], [0.5, 0.25]), mode
    case = CASES["select_const_branch_mlx3633"]
    assert mlx_adapter.gradient(case, "jvp", np.asarray(case.points)).tolist() == [6.0, 0.0]


def test_loops_and_selects_are_right_in_every_mode():
    cases = [c for c in REGISTRY if c.kind in ("loop", "select-jvp")]
    result = cross.run(cases, ["tf", "mlx"])
    assert not cross.failing(result), [(c.case, c.framework, c.mode, c.detail) for c in cross.failing(result)]
    statuses = {(c.framework, c.mode, c.status) for c in result.cells if c.case == "fori_acc_div_x_n4"}
    assert ("tf", "jit_compile", "OK") in statuses and ("mlx", "compile", "OK") in statuses


def test_patched_lowering_equals_eager_on_every_tf_case():
    """tf:jit_patched (the patch's tf2xla lowerings inside TF 2.21.0) == tf eager on the
    registry; the dead-branch points bitwise (0, not NaN)."""
    from xla_harness.gradcheck.frameworks import Unsupported, tf_adapter

    assert tf_adapter.PATCHED_MODE in tf_adapter.modes()
    compared, fixed = 0, []
    for case in REGISTRY:
        if not case.reverse:
            continue
        try:
            eager = _tf(case.name, "eager")
        except Unsupported:
            continue
        patched, stock = _tf(case.name, "jit_patched"), _tf(case.name, "jit_compile")
        np.testing.assert_allclose(patched, eager, rtol=1e-6, atol=0, equal_nan=True, err_msg=case.name)
        if case.dead is not None:
            dead = np.asarray(case.dead)
            np.testing.assert_array_equal(patched[dead], eager[dead], err_msg=case.name)
        if not np.array_equal(stock, eager, equal_nan=True) and np.isnan(stock).any():
            fixed.append(case.name)
        compared += 1
    assert compared >= 55
    assert set(fixed) == {"where_sqrt", "where_rsqrt", "where_reciprocal_op", "where_sqrt_neg",
                          "safe_distance_identical"}


class _Runner:
    """Stands in for BinaryOpsTest: runs the patch's own test block against real TF."""

    float_types = (np.float32, np.float64, "bfloat16", np.float16)  # as TF's own binary_ops_test

    def __init__(self, mode, ops):
        self.mode, self.ops, self.failures = mode, ops, []

    def _testBinary(self, op, a, b, expected, **kw):  # noqa: N802 - TF's name
        import tensorflow as tf

        op = self.ops.get(op.__name__, op)

        def f(y, dy):
            return op(y=y, dy=dy)

        if self.mode != "eager":
            f = tf.function(f, jit_compile=True, autograph=False)
        got = tf.cast(f(tf.constant(a), tf.constant(b)), tf.float64).numpy()
        if not np.allclose(got, expected, rtol=1e-3, atol=1e-6, equal_nan=False):
            self.failures.append((op.__name__, got.tolist()))


def _patch_test_block():
    """The lines the patch adds to TF's binary_ops_test.py, dedented to run here."""
    import textwrap

    return textwrap.dedent(added_lines(PATCH.read_text(), "tensorflow/compiler/tests/binary_ops_test.py"))


def _stock_lib():
    import tensorflow as tf

    from xla_harness.gradcheck.frameworks import tf_adapter

    tf_adapter.oplib()  # the patched library first: both load before the first XLA compilation
    return tf.load_op_library(os.environ["XLA_HARNESS_TF_OPLIB_STOCK"])


@pytest.mark.parametrize("mode,lib,passes", [("eager", "tf", True), ("jit", "tf", False), ("jit", "patched", True),
                                             ("jit", "stock", False)])
def test_patch_tests_pass_on_eager_and_patched_xla_and_fail_on_stock_xla(mode, lib, passes):
    """The patch's test block in four dtypes: TF's eager kernels and the patched lines pass; TF's
    own jit lowering and the control (the replaced lines, compiled the same way) fail."""
    import tensorflow as tf
    from tensorflow.python.framework import dtypes
    from tensorflow.python.ops import gen_math_ops

    from xla_harness.gradcheck.frameworks import tf_adapter

    patched, stock = tf_adapter.oplib(), _stock_lib()
    ops = {"tf": {},
           "patched": {"sqrt_grad": patched.harness_sqrt_grad, "rsqrt_grad": patched.harness_rsqrt_grad,
                       "reciprocal_grad": patched.harness_reciprocal_grad},
           "stock": {"sqrt_grad": stock.harness_stock_sqrt_grad, "rsqrt_grad": stock.harness_stock_rsqrt_grad,
                     "reciprocal_grad": stock.harness_stock_reciprocal_grad}}[lib]
    block = _patch_test_block()
    assert block.count("self._testBinary(") == 3
    for one in _Runner.float_types:
        runner = _Runner(mode, ops)
        dtype = getattr(tf, one).as_numpy_dtype if isinstance(one, str) else one
        exec(block, {"self": runner, "np": np, "dtype": dtype, "dtypes": dtypes, "gen_math_ops": gen_math_ops,
                     "tf": tf})
        assert (runner.failures == []) == passes, (one, runner.failures)


def test_control_stock_lines_give_nan_where_patched_lines_give_zero_in_four_dtypes():
    """The control: the op library built from the replaced lines is TF's lowering bitwise and gives
    NaN at every singular dead-branch point where the patched lines give 0, in f32/f64/bf16/f16."""
    import tensorflow as tf  # noqa: F401

    _stock_lib()
    rows = control.measure(Path(os.environ["XLA_HARNESS_TF_OPLIB"]), Path(os.environ["XLA_HARNESS_TF_OPLIB_STOCK"]))
    assert control.failures(rows) == []
    singular = [r for r in rows if r.singular]
    assert {r.dtype for r in singular} == set(control.DTYPES)
    assert {r.what for r in singular} >= set(control.OPS)
    assert all(np.isnan(r.stock) and np.isnan(r.tf_jit) and r.patched == 0 and r.eager == 0 for r in singular)
    assert len(singular) == 4 * (7 + 5)  # 7 op-level points and 5 where-gradient points per dtype


def test_stock_mlir_legalization_is_the_unguarded_pattern_0002_changes():
    """TF 2.21's own xla-legalize-tf: SqrtGrad and RsqrtGrad go through lower_tf.td's patterns
    (multiply/divide, no select) unless the tf2xla kernels are preferred; ReciprocalGrad never."""
    got = {(op, label): what for op, label, what in control.mlir_lowerings()}
    no_fallback, prefer = list(control.MLIR_PIPELINES)[0], list(control.MLIR_PIPELINES)[2]
    assert got[("SqrtGrad", no_fallback)].endswith("mhlo.multiply, mhlo.divide")
    assert "mhlo.select" not in got[("SqrtGrad", no_fallback)] and "mhlo.divide" in got[("RsqrtGrad", no_fallback)]
    for op in control.OPS:
        assert got[(op, prefer)] == f"tf.{op} left for the tf2xla kernel"
    assert got[("ReciprocalGrad", no_fallback)] == "tf.ReciprocalGrad left for the tf2xla kernel"


def test_jit_compile_on_cpu_compiles_with_the_tf2xla_kernels_whatever_the_bridge_setting():
    probes = control.bridges()
    assert [p.setting for p in probes] == list(control.BRIDGE_SETTINGS)
    for p in probes:
        assert p.bridge == "old bridge (tf2xla kernels)", (p.setting, p.bridge, p.lines)
        assert p.result.startswith("[nan, nan, 0.5, 0.25]"), p.result


def test_cli_table_names_the_disagreeing_modes():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    res = subprocess.run([sys.executable, "-m", "xla_harness.cli", "gradcheck", "--framework", "jax,tf,mlx",
                          "--cases", "where_sqrt,select_const_branch_mlx3633"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 1, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.startswith(("where_", "select_"))}
    assert "tf: eager!=jit_compile" in rows["where_sqrt"]
    head = res.stdout.splitlines()[0].split()
    assert head[:5] == ["case", "jax:eager", "jax:jit", "jax:vjp", "jax:jvp"]
    assert "tf:jit_patched" in head and "mlx:compile" in head
    cells = dict(zip(head, rows["where_sqrt"].split(), strict=False))
    assert cells["tf:eager"] == "OK" and cells["tf:jit_compile"] == "NaN" and cells["tf:jit_patched"] == "OK"
    assert cells["mlx:eager"] == "NaN"
