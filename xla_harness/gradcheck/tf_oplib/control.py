"""The control for the op library: TF's stock tf2xla lowerings against the patched ones, in one TF.

Two op libraries built by ``build.py`` from the two sides of patches/tensorflow/0001 (``--side
stock``: the lines the patch replaces; the default: its new lines) are loaded into the installed
TensorFlow and run under ``tf.function(jit_compile=True)`` in float32, float64, bfloat16 and
float16, next to TF's own ops (``tf.raw_ops.SqrtGrad`` etc.) eager and under jit_compile. The
control holds when, at every point:

* the stock library equals TF's own jit_compile lowering bitwise (it *is* TF's lowering);
* where dy == 0 and the local derivative is infinite or NaN, stock and TF's jit give NaN, the
  patched library and TF's eager kernel give 0 (where dy == 0 and the derivative is finite,
  stock gives +-0 and the patched library +0);
* where dy != 0, stock, patched and TF's jit agree bitwise.

The same holds for the gradient of ``tf.where(x > 0, tf.sqrt(x), 0)`` (and rsqrt, reciprocal)
with each library's op as the gradient (``tf.custom_gradient``) at x = [-1, 0, 1, 4].

``bridges()`` asks TF which bridge compiles a jit_compile function on CPU (its own VLOG lines of
``xla_compiler.cc``, in a subprocess per setting); ``mlir_lowerings()`` runs TF's own registered
``xla-legalize-tf`` pass on each op, as the MLIR bridge would with and without preferring the
tf2xla kernels.

    python -m xla_harness.gradcheck.tf_oplib.control --patched SO --stock SO --out DIR
        # writes DIR/control.md; exit 1 if the control does not hold, 2 on bad input
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc

DTYPES = ("float32", "float64", "bfloat16", "float16")
OPS = ("SqrtGrad", "RsqrtGrad", "ReciprocalGrad")
NAN = float("nan")
INF = float("inf")
# (op, what the point is, y, dy): y is the forward output the gradient op receives.
POINTS = (
    ("SqrtGrad", "dy=0, y=0 (sqrt at 0)", 0.0, 0.0),
    ("SqrtGrad", "dy=0, y=NaN (sqrt of -1)", NAN, 0.0),
    ("SqrtGrad", "dy=-0, y=0", 0.0, -0.0),
    ("SqrtGrad", "dy=2, y=4 (live)", 4.0, 2.0),
    ("RsqrtGrad", "dy=0, y=inf (rsqrt at 0)", INF, 0.0),
    ("RsqrtGrad", "dy=0, y=NaN (rsqrt of -1)", NAN, 0.0),
    ("RsqrtGrad", "dy=2, y=1 (live)", 1.0, 2.0),
    ("ReciprocalGrad", "dy=0, y=inf (1/x at 0)", INF, 0.0),
    ("ReciprocalGrad", "dy=0, y=-inf (1/x at -0)", -INF, 0.0),
    ("ReciprocalGrad", "dy=3, y=2 (live)", 2.0, 3.0),
)
WHERE_X = (-1.0, 0.0, 1.0, 4.0)
COLUMNS = ("eager", "tf_jit", "stock", "patched")


@dataclass(frozen=True)
class Row:
    """One point in one dtype: the four columns as Python floats (NaN kept)."""

    what: str          # "SqrtGrad" or "where(x > 0, sqrt(x), 0)'"
    point: str
    dtype: str
    dy_zero: bool      # a dead-branch point (dy == 0, or x <= 0 in the where gradient)
    singular: bool     # ... where the local derivative is infinite or NaN (stock must give NaN)
    eager: float
    tf_jit: float
    stock: float
    patched: float


def _same(a: float, b: float) -> bool:
    """Bitwise equality of two results read back as floats (NaN equals NaN; 0 and -0 differ)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def failures(rows: list[Row]) -> list[str]:
    """Every way the control does not hold, one sentence each (empty: it holds)."""
    out = []
    dtypes = {r.dtype for r in rows}
    if not set(DTYPES) <= dtypes:
        out.append(f"dtypes not covered: {', '.join(d for d in DTYPES if d not in dtypes)}")
    for r in rows:
        at = f"{r.what} {r.point} {r.dtype}"
        if not _same(r.stock, r.tf_jit):
            out.append(f"{at}: stock library {r.stock} differs from TF's own jit_compile lowering {r.tf_jit}")
        if r.dy_zero:
            if r.singular and not math.isnan(r.stock):
                out.append(f"{at}: stock gives {r.stock}, the control expects NaN")
            if not r.singular and r.stock != 0:
                out.append(f"{at}: stock gives {r.stock} at a finite dead point, expected +-0")
            if not _same(r.patched, 0.0):
                out.append(f"{at}: patched gives {r.patched}, expected 0")
            if not _same(r.eager, 0.0):
                out.append(f"{at}: eager gives {r.eager}, expected 0")
        elif not (_same(r.patched, r.stock) and math.isfinite(r.patched)):
            out.append(f"{at}: live point, patched {r.patched} and stock {r.stock} differ")
    return out


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if v == 0:
        return "-0" if math.copysign(1, v) < 0 else "0"
    return f"{v:g}"


def table(rows: list[Row]) -> str:
    """Markdown table, one line per (what, point, dtype)."""
    head = ["what", "point", "dtype", "eager (TF kernel)", "jit_compile (TF's lowering)",
            "jit stock lines (control)", "jit patched lines"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r.what, r.point, r.dtype, *(_fmt(getattr(r, c)) for c in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(patched_so: Path, stock_so: Path) -> list[Row]:
    """Run every point in every dtype in this process (TF must be importable)."""
    for so in (patched_so, stock_so):
        if not so.is_file():
            raise HarnessError(f"{so}: no such op library (make tf-oplib builds both)")
    try:
        import tensorflow as tf
    except ImportError:
        raise HarnessError("tensorflow is not importable in this interpreter; use .venv-frameworks") from None
    # Both libraries before the first XLA compilation, which registers the JIT kernels once.
    patched, stock = tf.load_op_library(str(patched_so)), tf.load_op_library(str(stock_so))
    ops = {"patched": {o: getattr(patched, "harness_" + _snake(o)) for o in OPS},
           "stock": {o: getattr(stock, "harness_stock_" + _snake(o)) for o in OPS},
           "tf": {o: getattr(tf.raw_ops, o) for o in OPS}}

    def jit(fn):
        return tf.function(fn, jit_compile=True, autograph=False)

    def value(t) -> float:
        return float(tf.cast(t, tf.float64).numpy())

    rows = []
    for dtype in DTYPES:
        dt = getattr(tf, dtype)
        for op, point, y, dy in POINTS:
            ty, tdy = tf.constant(y, dt), tf.constant(dy, dt)
            got = {"eager": ops["tf"][op](y=ty, dy=tdy),
                   "tf_jit": jit(lambda a, b, f=ops["tf"][op]: f(y=a, dy=b))(ty, tdy),
                   "stock": jit(lambda a, b, f=ops["stock"][op]: f(y=a, dy=b))(ty, tdy),
                   "patched": jit(lambda a, b, f=ops["patched"][op]: f(y=a, dy=b))(ty, tdy)}
            rows.append(Row(op, point, dtype, dy == 0, dy == 0, **{k: value(v) for k, v in got.items()}))
        rows += _where_rows(tf, ops, dt, dtype, jit, value)
    return rows


def _snake(op: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")


def _where_rows(tf, ops, dt, dtype, jit, value) -> list[Row]:
    """d/dx sum(where(x > 0, f(x), 0)) with f's gradient op from each column."""
    forwards = {"SqrtGrad": ("sqrt", tf.math.sqrt), "RsqrtGrad": ("rsqrt", tf.math.rsqrt),
                "ReciprocalGrad": ("reciprocal", tf.math.reciprocal)}
    rows = []
    for op, (name, forward) in forwards.items():
        def with_grad(grad_op, forward=forward):
            @tf.custom_gradient
            def f(x):
                y = forward(x)
                return y, lambda dy: grad_op(y=y, dy=dy)
            return f

        def grad_of(f):
            def g(x):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    out = tf.reduce_sum(tf.where(x > 0, f(x), tf.zeros_like(x)))
                return tape.gradient(out, x)
            return g

        xs = tf.constant(WHERE_X, dt)
        cols = {"eager": grad_of(forward)(xs), "tf_jit": jit(grad_of(forward))(xs),
                "stock": jit(grad_of(with_grad(ops["stock"][op])))(xs),
                "patched": jit(grad_of(with_grad(ops["patched"][op])))(xs)}
        for i, xi in enumerate(WHERE_X):
            singular = xi == 0 or (xi < 0 and op != "ReciprocalGrad")  # 1/x is finite at x = -1
            rows.append(Row(f"grad where(x > 0, {name}(x), 0)", f"x={xi:g}", dtype, xi <= 0, singular,
                            **{k: value(v[i]) for k, v in cols.items()}))
    return rows


# --- which bridge jit_compile uses -------------------------------------------------------------

_PROBE = """
import os, sys
import tensorflow as tf
if sys.argv[1] == "enable_mlir_bridge":
    tf.config.experimental.enable_mlir_bridge()
@tf.function(jit_compile=True)
def g(x):
    with tf.GradientTape() as t:
        t.watch(x)
        y = tf.reduce_sum(tf.where(x > 0, tf.sqrt(x), tf.zeros_like(x)))
    return t.gradient(y, x)
print("RESULT", g(tf.constant([-1.0, 0.0, 1.0, 4.0])).numpy().tolist())
"""
BRIDGE_SETTINGS = {
    "default": {},
    "enable_mlir_bridge": {},
    "TF_XLA_FLAGS=--tf_mlir_enable_mlir_bridge=true": {"TF_XLA_FLAGS": "--tf_mlir_enable_mlir_bridge=true"},
}
# xla_compiler.cc's VLOG(1) lines: TF 2.21 prints "CompileFunction with XlaBuilder" on the
# path that runs the tf2xla kernels; older releases print "Using ... bridge to compile".
MARKERS = {"Using MLIR bridge to compile the function": "MLIR bridge",
           "Using the old bridge to compile the function": "old bridge (tf2xla kernels)",
           "CompileFunction with XlaBuilder": "old bridge (tf2xla kernels)"}


@dataclass(frozen=True)
class BridgeProbe:
    setting: str
    bridge: str        # "MLIR bridge", "old bridge", or what was seen instead
    result: str        # the gradient at x = [-1, 0, 1, 4]
    lines: tuple[str, ...]


def classify(stderr: str) -> tuple[str, tuple[str, ...]]:
    """The bridge named by xla_compiler.cc's VLOG(1) lines in ``stderr``, and those lines."""
    seen = tuple(line.strip() for line in stderr.splitlines() if any(m in line for m in MARKERS))
    kinds = {k for line in seen for m, k in MARKERS.items() if m in line}
    if len(kinds) == 1:
        return kinds.pop(), seen
    if not kinds:
        return "not reported (no xla_compiler VLOG line)", seen
    return "both: " + ", ".join(sorted(kinds)), seen


def bridges(python: str = sys.executable, timeout: int = 600) -> list[BridgeProbe]:
    out = []
    for setting, extra in BRIDGE_SETTINGS.items():
        env = {k: v for k, v in os.environ.items() if k != "TF_XLA_FLAGS"}
        env.update(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="xla_compiler=1", **extra)
        arg = "enable_mlir_bridge" if setting == "enable_mlir_bridge" else "default"
        res = subproc.run([python, "-c", _PROBE, arg], capture_output=True, text=True, env=env, timeout=timeout,
                          what=f"the bridge probe ({setting})")
        result = next((line[7:] for line in res.stdout.splitlines() if line.startswith("RESULT ")),
                      f"no result (exit {res.returncode})")
        bridge, lines = classify(res.stderr)
        out.append(BridgeProbe(setting, bridge, result, lines))
    return out


# --- what the installed TF's own MLIR legalization does with these ops ---------------------------

MLIR_PIPELINES = {
    "xla-legalize-tf (no tf2xla fallback)": "xla-legalize-tf",
    "prefer-tf2xla=false, fallback on": "xla-legalize-tf{device-type=XLA_CPU_JIT prefer-tf2xla=false "
                                        "use-tf2xla-fallback=true}",
    "prefer-tf2xla=true, fallback on (TPU bridge)": "xla-legalize-tf{device-type=XLA_CPU_JIT "
                                                    "prefer-tf2xla=true use-tf2xla-fallback=true}",
}
_MLIR_FUNC = """
func.func @f(%y: tensor<2xf32>, %dy: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "tf.OP"(%y, %dy) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  func.return %0 : tensor<2xf32>
}
"""


def lowered_ops(mlir_text: str, op: str) -> str:
    """What a legalized module computes for ``op``: 'left to the tf2xla kernel' when tf.<op>
    is still there, else the mhlo/chlo ops in order."""
    if f'"tf.{op}"' in mlir_text:
        return f"tf.{op} left for the tf2xla kernel"
    found = re.findall(r'^\s*%\S+ = "?([\w.]+)', mlir_text, re.M)
    body = [f for f in found if f.startswith(("mhlo.", "chlo.", "stablehlo."))]
    return ", ".join(body) or "nothing recognisable"


def mlir_lowerings() -> list[tuple[str, str, str]]:
    """(op, pipeline label, what it lowers to) from TF's own registered xla-legalize-tf pass."""
    from tensorflow.python import pywrap_mlir

    out = []
    for op in OPS:
        for label, pipeline in MLIR_PIPELINES.items():
            try:
                text = pywrap_mlir.experimental_run_pass_pipeline(_MLIR_FUNC.replace("OP", op), pipeline, False)
            except Exception as exc:  # noqa: BLE001 - TF raises its own status errors; report the first line
                text = ""
                out.append((op, label, "error: " + str(exc).splitlines()[0]))
                continue
            out.append((op, label, lowered_ops(text, op)))
    return out


def report(rows: list[Row], probes: list[BridgeProbe], tf_version: str,
           mlir: list[tuple[str, str, str]] | None = None) -> str:
    bad = failures(rows)
    lines = [f"# Control: TF's stock tf2xla lowerings vs patches/tensorflow/0001, tensorflow {tf_version}", "",
             "Columns: `tf.raw_ops.<Op>` eager (TF's CPU kernel) and under `jit_compile=True` (TF's own "
             "tf2xla lowering); the op library built from the lines the patch replaces (`build.py --side "
             "stock`, ops HarnessStock*) and from its new lines (ops Harness*), each under "
             "`jit_compile=True`. The `grad where` rows use each op as the gradient of the forward op "
             "(`tf.custom_gradient`); eager and jit_compile there are TF's registered gradients.", "",
             table(rows), "",
             "control: " + ("holds (stock NaN where the patched lines give 0, stock == TF's lowering bitwise)"
                            if not bad else "FAILS"), *(f"- {b}" for b in bad), ""]
    if probes:
        lines += ["## Which bridge compiles jit_compile on CPU", "",
                  "| setting | bridge (xla_compiler.cc VLOG(1)) | grad where(x > 0, sqrt(x), 0) at x = -1, 0, 1, 4 |",
                  "| --- | --- | --- |"]
        lines += [f"| {p.setting} | {p.bridge} | {p.result} |" for p in probes]
        lines += ["", "Lines seen (`TF_CPP_VMODULE=xla_compiler=1`):", ""]
        lines += [f"- {p.setting}: `{line}`" for p in probes for line in p.lines[:2]] or ["- none"]
        lines += [""]
    if mlir:
        lines += ["## The MLIR bridge's legalization of these ops in this TF", "",
                  "TF's own `xla-legalize-tf` pass (`pywrap_mlir.experimental_run_pass_pipeline`) on "
                  "`tf.<Op>(y, dy)` with f32 operands: which lowering the stock pass picks.", "",
                  "| op | pipeline | lowers to |", "| --- | --- | --- |"]
        lines += [f"| {op} | {label} | {what} |" for op, label, what in mlir]
        lines += [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--patched", type=Path, required=True, help="op library of the patch's lines (build.py)")
    p.add_argument("--stock", type=Path, required=True, help="op library of the stock lines (build.py --side stock)")
    p.add_argument("--out", type=Path, required=True, help="folder for control.md")
    p.add_argument("--no-bridges", action="store_true", help="skip the bridge probes (subprocesses)")
    args = p.parse_args(argv)
    try:
        rows = measure(args.patched, args.stock)
        probes = [] if args.no_bridges else bridges()
        import tensorflow as tf

        text = report(rows, probes, tf.__version__, mlir_lowerings())
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "control.md").write_text(text, encoding="utf-8")
        except OSError as exc:
            raise HarnessError(f"cannot write {args.out / 'control.md'}: {exc.strerror}") from None
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 1 if failures(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
