"""patches/tensorflow/0001 (tf2xla kernels) and 0002 (the MLIR bridge's lower_tf patterns):
series entries, application, the op-library sources taken from both sides of 0001, the
control's verdict and the PR bundle. The lowerings themselves run in tests/frameworks (real TF)."""

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.gradcheck.tf_oplib import build, control
from xla_harness.upstream.patchfile import parse_patch, preimage_tree
from xla_harness.upstream.series import load_series

from ..helpers import git_am

ROOT = Path(__file__).resolve().parents[2]
TF1 = ROOT / "patches" / "tensorflow" / "0001-tf2xla-zero-gradient-where-dy-is-zero.patch"
TF2 = ROOT / "patches" / "tensorflow" / "0002-mlir-lower-tf-zero-gradient-where-dy-is-zero.patch"
LOWER_TF_TD = "tensorflow/compiler/mlir/tensorflow/transforms/lower_tf.td"


def test_series_entry():
    tf = load_series().upstream("tensorflow")
    assert [p.file for p in tf.select("default")] == [f.relative_to(ROOT / "patches").as_posix() for f in (TF1, TF2)]
    assert tf.base_ref == "v2.21.0" and "not readable" in tf.checked_against
    assert "lower_tf.td" in tf.checked_against


def test_mlir_patch_guards_both_patterns_and_updates_their_filecheck_tests():
    text = TF2.read_text()
    hunks = parse_patch(text)
    assert {h.file for h in hunks} == {LOWER_TF_TD, "tensorflow/compiler/mlir/tensorflow/tests/lower_tf.mlir"}
    added = build.added_lines(text, LOWER_TF_TD)
    # one DRR class wraps both patterns in SelectV2(Equal(dy, 0), 0, formula)
    assert added.count("class ZeroWhereGradientIsZero<") == 1 and "(TF_SelectV2Op" in added
    assert "(TF_EqualOp" in added and "GetScalarOfType<0> $dy" in added
    assert "def LowerSqrtGradOp : ZeroWhereGradientIsZero<" in added
    assert "def LowerRsqrtGradOp : ZeroWhereGradientIsZero<" in added
    mlir = build.added_lines(text, "tensorflow/compiler/mlir/tensorflow/tests/lower_tf.mlir")
    assert "func.func @sqrt_grad(" in mlir  # a new ranked f32 case; the three existing ones are updated
    for fn in ("@rsqrt_grad(", "@rsqrt_grad_unranked(", "@sqrt_grad_unranked("):
        assert fn in text
    assert mlir.count('"tf.SelectV2"(%[[IS_ZERO]], %[[ZERO]]') == 3
    message = text.split("\n---\n", 1)[0]
    assert "ReciprocalGrad has no" in message and "IsOpTypeAllowedTf2XlaPreferred" in message


def test_patch_touches_the_lowerings_and_the_xla_op_tests():
    text = TF1.read_text()
    assert {h.file for h in parse_patch(text)} == {"tensorflow/compiler/tf2xla/kernels/binary_ops.cc",
                                                   "tensorflow/compiler/tests/binary_ops_test.py"}
    message = text.split("\n---\n", 1)[0]
    for op in ("SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "InvGrad", "TanhGrad", "SigmoidGrad", "IgammaGradA"):
        assert op in message  # every functor of cwise_ops_gradients.h is accounted for


@pytest.mark.slow
def test_patches_check_applies_to_its_preimage_and_names_a_failing_hunk(tmp_path, capsys):
    tree = tmp_path / "tf"
    preimage_tree(TF1.read_text(), tree)
    preimage_tree(TF2.read_text(), tree)
    assert main(["patches-check", "--tf-src", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "tensorflow: applies: tensorflow/0001" in out and "tensorflow: applies: tensorflow/0002" in out
    cc = tree / "tensorflow/compiler/tf2xla/kernels/binary_ops.cc"
    cc.write_text(cc.read_text().replace("XLA_MAKE_BINARY(RealDiv", "XLA_MAKE_BINARY(RealDivision"))
    assert main(["patches-check", "--tf-src", str(tree)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tensorflow/0001") and "binary_ops.cc" in err[0]


@pytest.mark.slow
def test_patches_check_names_a_changed_lower_tf_pattern(tmp_path, capsys):
    tree = tmp_path / "tf"
    preimage_tree(TF1.read_text(), tree)
    preimage_tree(TF2.read_text(), tree)
    td = tree / LOWER_TF_TD
    td.write_text(td.read_text().replace("// SqrtGrad(y, dy) = dy * 0.5 / y", "// SqrtGrad(y, dy) = 0.5 * dy / y"))
    assert main(["patches-check", "--tf-src", str(tree)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tensorflow/0002") and "lower_tf.td" in err[0]


def test_oplib_source_is_the_patch_with_renamed_ops():
    src = build.lowerings_source(TF1.read_text())
    assert re.findall(r"XLA_MAKE_BINARY\(\s*(\w+)", src) == ["HarnessReciprocalGrad", "HarnessRsqrtGrad",
                                                             "HarnessSqrtGrad"]
    assert "xla::Select(xla::Eq(dy, xla::ZerosLike(dy))" in src
    assert "RealDiv" not in src and "-XLA_MAKE" not in src  # context before the change and removed lines stay out
    # Every added line of binary_ops.cc is in the compiled source (renames aside).
    added = build.added_lines(TF1.read_text(), build.LOWERINGS_FILE)
    assert added and all(line.replace("(ReciprocalGrad", "(HarnessReciprocalGrad") in src
                         for line in added.splitlines(keepends=True))


def test_oplib_control_source_is_the_lines_the_patch_replaces():
    src = build.lowerings_source(TF1.read_text(), "stock")
    assert re.findall(r"XLA_MAKE_BINARY\(\s*(\w+)", src) == ["HarnessStockReciprocalGrad", "HarnessStockRsqrtGrad",
                                                             "HarnessStockSqrtGrad"]
    assert "Select" not in src and "ZeroWhereGradientIsZero" not in src and "RealDiv" not in src
    # every removed line of binary_ops.cc is in the control's source (renames aside)
    diff = TF1.read_text().split("diff --git a/" + build.LOWERINGS_FILE, 1)[1]
    removed = [line[1:] for line in diff.splitlines(keepends=True)
               if line.startswith("-") and not line.startswith("---")]
    renamed = [re.sub(r"\b(SqrtGrad|RsqrtGrad|ReciprocalGrad)\b", r"HarnessStock\1", line) for line in removed]
    assert renamed and all(line in src for line in renamed)
    with pytest.raises(HarnessError, match="unknown side"):
        build.lowerings_source(TF1.read_text(), "both")


def test_control_and_patched_builds_register_different_op_names():
    src, inc = Path("harness_grad_ops.cc"), Path("o")
    stock = build.compile_command(src, inc, Path("o/x.so"), "/tf/include", "/tf", "stock")
    patched = build.compile_command(src, inc, Path("o/x.so"), "/tf/include", "/tf")
    assert '-DHARNESS_OP_PREFIX="HarnessStock"' in stock and '-DHARNESS_OP_PREFIX="Harness"' in patched
    assert 'HARNESS_OP_PREFIX "SqrtGrad"' in (build.HERE / "harness_grad_ops.cc").read_text()


def _row(**kw):
    base = dict(what="SqrtGrad", point="dy=0, y=0", dtype="float32", dy_zero=True, singular=True,
                eager=0.0, tf_jit=float("nan"), stock=float("nan"), patched=0.0)
    return control.Row(**{**base, **kw})


def _all_dtypes(**kw):
    return [_row(dtype=d, **kw) for d in control.DTYPES]


def test_control_verdict_holds_on_stock_nan_and_patched_zero():
    rows = _all_dtypes() + _all_dtypes(point="live", dy_zero=False, singular=False, eager=0.25, tf_jit=0.25,
                                       stock=0.25, patched=0.25)
    rows += _all_dtypes(point="1/x at -1", singular=False, tf_jit=-0.0, stock=-0.0)
    assert control.failures(rows) == []


@pytest.mark.parametrize("planted,expect", [
    (dict(stock=0.0, tf_jit=0.0), "the control expects NaN"),          # stock built from the patched lines
    (dict(patched=float("nan")), "patched gives nan, expected 0"),     # patched built from the stock lines
    (dict(patched=-0.0), "patched gives -0.0, expected 0"),            # the sign of zero counts
    (dict(stock=float("nan"), tf_jit=1.0), "differs from TF's own"),   # the control is not TF's lowering
    (dict(eager=float("nan")), "eager gives nan"),
    (dict(dy_zero=False, singular=False, stock=0.5, patched=0.25, tf_jit=0.5), "live point"),
    (dict(singular=False, stock=1.0, tf_jit=1.0), "finite dead point"),
])
def test_control_verdict_catches_each_planted_failure(planted, expect):
    rows = _all_dtypes()
    rows[2] = _row(dtype=rows[2].dtype, **planted)
    found = control.failures(rows)
    assert len(found) >= 1 and any(expect in f for f in found), found


def test_control_verdict_needs_all_four_dtypes():
    found = control.failures([r for r in _all_dtypes() if r.dtype != "bfloat16"])
    assert found == ["dtypes not covered: bfloat16"]


def test_bridge_lines_are_classified():
    old = "I0000 xla_compiler.cc:901] CompileFunction with XlaBuilder\n"
    assert control.classify("noise\n" + old)[0] == "old bridge (tf2xla kernels)"
    assert control.classify("x] Using MLIR bridge to compile the function\n")[0] == "MLIR bridge"
    assert control.classify("nothing here")[0].startswith("not reported")
    both = old + "x] Using MLIR bridge to compile the function\n"
    assert control.classify(both)[0].startswith("both:")


def test_lowered_ops_reads_a_legalized_module():
    lowered = """module {
  func.func @f(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>) -> tensor<2xf32> {
    %0 = mhlo.constant dense<5.000000e-01> : tensor<f32>
    %1 = "mhlo.broadcast_in_dim"(%0) <{broadcast_dimensions = dense<> : tensor<0xi64>}> : (tensor<f32>) -> tensor<2xf32>
    %2 = mhlo.multiply %arg1, %1 : tensor<2xf32>
    %3 = mhlo.divide %2, %arg0 : tensor<2xf32>
    return %3 : tensor<2xf32>
  }
}"""
    assert control.lowered_ops(lowered, "SqrtGrad") == ("mhlo.constant, mhlo.broadcast_in_dim, mhlo.multiply, "
                                                        "mhlo.divide")
    kept = '%0 = "tf.SqrtGrad"(%arg0, %arg1) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>'
    assert control.lowered_ops(kept, "SqrtGrad") == "tf.SqrtGrad left for the tf2xla kernel"


def test_control_cli_missing_library_is_one_error_line(tmp_path, capsys):
    code = control.main(["--patched", str(tmp_path / "p.so"), "--stock", str(tmp_path / "s.so"),
                         "--out", str(tmp_path / "o"), "--no-bridges"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "p.so" in err[0]


def test_oplib_source_rejects_a_patch_without_the_ops():
    text = TF1.read_text().replace("SqrtGrad,", "SqrtGradient,")
    with pytest.raises(HarnessError, match="defines SqrtGrad 0 times"):
        build.lowerings_source(text)


def test_oplib_build_without_tensorflow_is_one_error_line(tmp_path, capsys):
    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("tensorflow is installed here; tests/frameworks builds and loads the library")
    assert build.main(["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "tensorflow is not importable" in err[0] or "g++ is not installed" in err[0]
    assert not (tmp_path / "o" / "harness_grad_ops.so").exists()


def test_syntax_check_command_compiles_without_linking():
    src, inc = Path("harness_grad_ops.cc"), Path("o")
    check = build.compile_command(src, inc, None, "/tf/include", None)
    full = build.compile_command(src, inc, Path("o/x.so"), "/tf/include", "/tf")
    assert check[:2] == ["g++", "-fsyntax-only"] and "-o" not in check and not any(a.startswith("-l") for a in check)
    assert {"-shared", "-o", "-l:libtensorflow_cc.so.2"} <= set(full)
    # the same defines and include path in both, so the check compiles what the build compiles
    same = ("-I", "-D", "-std")
    assert [a for a in check if a.startswith(same)] == [a for a in full if a.startswith(same)]


def test_syntax_check_rejects_a_tree_that_is_not_tensorflow(tmp_path, capsys):
    assert build.main(["--out", str(tmp_path / "o"), "--tf-include", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a TensorFlow include tree" in err[0]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="not checked: no g++")
def test_syntax_check_reports_a_failing_compile(tmp_path, capsys):
    # a tree with cwise_ops.h but none of what it includes: g++ really runs and fails
    kernels = tmp_path / "inc" / "tensorflow" / "compiler" / "tf2xla" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "cwise_ops.h").write_text('#include "tensorflow/no/such/header.h"\n')
    assert build.main(["--out", str(tmp_path / "o"), "--tf-include", str(tmp_path / "inc")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not compile against" in err[0]
    log = (tmp_path / "o" / "syntax-check.log").read_text()
    assert log.startswith("g++ -fsyntax-only") and "no/such/header.h" in log and not log.endswith("exit 0\n")


@pytest.mark.slow
def test_pr_bundle_for_tensorflow(tmp_path):
    out = tmp_path / "pr"
    results = tmp_path / "results"
    (results / "cpu" / "gradcheck").mkdir(parents=True)
    (results / "cpu" / "gradcheck" / "gradcheck-frameworks.txt").write_text("case  tf:eager\nwhere_sqrt  OK\n")
    assert main(["pr", "--target", "tensorflow", "--out", str(out), "--results", str(results)]) == 0
    assert "No control table" in (out / "PR.md").read_text()
    (results / "tensorflow" / "tf-x").mkdir(parents=True)
    (results / "tensorflow" / "tf-x" / "control.md").write_text(
        "# Control: t\n\n| SqrtGrad | dy=0 | bfloat16 | 0 | NaN | NaN | 0 |\n\n## Which bridge\n")
    assert main(["pr", "--target", "tensorflow", "--out", str(out), "--results", str(results), "--force"]) == 0
    mbox = (out / "series.mbox").read_text()
    assert "\nSubject: [PATCH] [tf2xla] Zero gradient where dy == 0" in mbox
    assert "\nSubject: [PATCH] [mlir][tf] Zero gradient where dy == 0 in the SqrtGrad" in mbox
    desc = (out / "PR.md").read_text()
    assert "//tensorflow/compiler/tests:binary_ops_test_cpu" in desc and "where_sqrt  OK" in desc
    assert "//tensorflow/compiler/mlir/tensorflow/tests:lower_tf.mlir.test" in desc
    assert "results/tensorflow/tf-x/control.md" in desc and "| SqrtGrad | dy=0 | bfloat16 | 0 | NaN | NaN | 0 |" in desc
    assert "No control table" not in desc and "\n#### Which bridge" in desc
    assert "HLO fixtures" not in desc and "Scanner findings" not in desc
    am = git_am(TF1.read_text() + TF2.read_text(), out / "series.mbox", tmp_path / "am")
    assert am.returncode == 0, am.stderr
