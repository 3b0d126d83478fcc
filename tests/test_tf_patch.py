"""patches/tensorflow/0001: series entry, application, the op-library source taken from the
patch, and the PR bundle. The patched lowering itself runs in tests/frameworks (real TF)."""

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.gradcheck.tf_oplib import build
from xla_harness.upstream.patchfile import parse_patch, preimage_tree
from xla_harness.upstream.series import load_series

from .helpers import git_am

ROOT = Path(__file__).resolve().parent.parent
TF1 = ROOT / "patches" / "tensorflow" / "0001-tf2xla-zero-gradient-where-dy-is-zero.patch"


def test_series_entry():
    tf = load_series().upstream("tensorflow")
    assert [p.file for p in tf.select("default")] == [TF1.relative_to(ROOT / "patches").as_posix()]
    assert tf.base_ref == "v2.21.0" and "not readable" in tf.checked_against


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
    assert main(["patches-check", "--tf-src", str(tree)]) == 0
    assert "tensorflow: applies: tensorflow/0001" in capsys.readouterr().out
    cc = tree / "tensorflow/compiler/tf2xla/kernels/binary_ops.cc"
    cc.write_text(cc.read_text().replace("XLA_MAKE_BINARY(RealDiv", "XLA_MAKE_BINARY(RealDivision"))
    assert main(["patches-check", "--tf-src", str(tree)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tensorflow/0001") and "binary_ops.cc" in err[0]


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


def test_oplib_source_rejects_a_patch_without_the_ops():
    text = TF1.read_text().replace("SqrtGrad,", "SqrtGradient,")
    with pytest.raises(HarnessError, match="define SqrtGrad 0 times"):
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
    mbox = (out / "series.mbox").read_text()
    assert "\nSubject: [PATCH] [tf2xla] Zero gradient where dy == 0" in mbox
    desc = (out / "PR.md").read_text()
    assert "//tensorflow/compiler/tests:binary_ops_test_cpu" in desc and "where_sqrt  OK" in desc
    assert "HLO fixtures" not in desc and "Scanner findings" not in desc
    am = git_am(TF1.read_text(), out / "series.mbox", tmp_path / "am")
    assert am.returncode == 0, am.stderr
