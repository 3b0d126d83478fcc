"""make xla-test / xla-mutants: the pure planning of xla_harness.upstream.xlatest, and the
edges that need no XLA tree (CI has none; the real runs are logged under results/xla/)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.upstream import xlatest, xlatest_blast, xlatest_build, xlatest_gtest, xlatest_guards, xlatest_plan
from xla_harness.upstream.patchfile import preimage_tree
from xla_harness.upstream.series import Patch, Upstream, Variant, load_series

ROOT = Path(__file__).resolve().parents[2]
SERIES = load_series()
DEFAULT_XLA = [p.path(SERIES.root) for p in SERIES.upstream("xla").select("default")]

GTEST_RUN = """[==========] Running 3 tests from 1 test suite.
[ RUN      ] InstructionFusionTest.FuseInstructions
[       OK ] InstructionFusionTest.FuseInstructions (1 ms)
[ RUN      ] InstructionFusionTest.ScatterShouldNotFuseWithTransposeOfInPlaceOperand
xla/service/instruction_fusion_test.cc:1234: Failure
[  FAILED  ] InstructionFusionTest.ScatterShouldNotFuseWithTransposeOfInPlaceOperand (3 ms)
[ RUN      ] FusionDecisionTest.NotFusionPossibleDisjunction
[  SKIPPED ] FusionDecisionTest.NotFusionPossibleDisjunction (0 ms)
[==========] 3 tests from 1 test suite ran. (4 ms total)
[  PASSED  ] 1 test.
[  FAILED  ] 1 test, listed below:
[  FAILED  ] InstructionFusionTest.ScatterShouldNotFuseWithTransposeOfInPlaceOperand
"""


def test_parse_gtest_reports_each_test_once():
    got = xlatest_gtest.parse_gtest(GTEST_RUN)
    assert [(r.name, r.status) for r in got] == [
        ("InstructionFusionTest.FuseInstructions", "passed"),
        ("InstructionFusionTest.ScatterShouldNotFuseWithTransposeOfInPlaceOperand", "failed"),
        ("FusionDecisionTest.NotFusionPossibleDisjunction", "skipped"),
    ]
    assert xlatest_gtest.unit_verdict(got, 1) == "failed"
    passing = [r for r in got if r.status != "failed"]
    assert xlatest_gtest.unit_verdict(passing, 0) == "passed"
    assert xlatest_gtest.unit_verdict(passing, 1) == "failed"  # a nonzero exit is never a pass
    assert xlatest_gtest.unit_verdict([], -11) == "crashed"
    died = xlatest_gtest.parse_gtest(GTEST_RUN.split("[ RUN      ] FusionDecisionTest")[0]
                               + "[ RUN      ] FusionDecisionTest.NotFusionPossibleDisjunction\n")
    assert died[-1] == xlatest_gtest.TestResult("FusionDecisionTest.NotFusionPossibleDisjunction", "crashed")
    assert xlatest_gtest.unit_verdict(died, -11) == "crashed"
    assert xlatest_gtest.unit_verdict([], 0) == "no tests"


def test_plan_for_the_default_series():
    touched = xlatest_plan.touched_files(p.read_text() for p in DEFAULT_XLA)
    assert touched == ["xla/hlo/analysis/alias_info.h", "xla/service/BUILD", "xla/service/instruction_fusion.cc",
                       "xla/service/instruction_fusion_test.cc"]
    units = xlatest_plan.plan_units(touched)
    assert units == [xlatest_plan.TestUnit("xla/service/instruction_fusion.cc", "xla/service/instruction_fusion.h",
                                      "xla/service/instruction_fusion_test.cc")]
    assert units[0].name == "instruction_fusion_test"
    # the header of the patched source comes from the same tree as the source
    assert xlatest_plan.files_to_copy(units, touched) == [
        "xla/hlo/analysis/alias_info.h", "xla/service/BUILD", "xla/service/instruction_fusion.cc",
        "xla/service/instruction_fusion_test.cc", "xla/service/instruction_fusion.h"]


def test_plan_units_for_a_touched_test_or_header_only():
    assert xlatest_plan.plan_units(["xla/a/b_test.cc", "xla/a/b.h"]) == [
        xlatest_plan.TestUnit("xla/a/b.cc", "xla/a/b.h", "xla/a/b_test.cc")]
    assert xlatest_plan.plan_units(["xla/a/b.h"]) == []
    assert len(xlatest_plan.plan_units(["xla/a/b.cc", "xla/a/b_test.cc", "xla/c/d.cc"])) == 2


@pytest.mark.parametrize("wheel_lacks,expected", [
    (set(), []),
    ({"xla/tsl/platform/status_macros.h"}, ["xla/tsl/platform/status_macros.h"]),
    ({"xla/hlo/utils/hlo_matchers.h", "xla/tsl/platform/status_macros.h"},
     ["xla/hlo/utils/hlo_matchers.h", "xla/tsl/platform/status_macros.h", "xla/hlo/utils/hlo_matchers.cc"]),
])
def test_support_files_only_where_the_wheel_lacks_them(wheel_lacks, expected):
    assert xlatest_plan.support_files_needed(lambda f: f not in wheel_lacks) == expected


def test_toolchain_argv(tmp_path):
    tc = xlatest_plan.Toolchain("g++", tmp_path / "tree", tmp_path / "whl" / "include", tmp_path / "whl")
    argv = tc.compile_argv(tmp_path / "tree" / "a.cc", tmp_path / "a.o")
    incs = [a[2:] for a in argv if a.startswith("-I")]
    # the patched copy shadows the wheel's headers; the shim comes before the wheel too
    assert incs[:3] == [str(tmp_path / "tree"), str(xlatest_plan.SHIM_DIR), str(tmp_path / "whl" / "include")]
    assert argv[:3] == ["nice", "-n", "10"] and "-std=c++17" in argv and "-D_GLIBCXX_USE_CXX11_ABI=1" in argv
    link = tc.link_argv([tmp_path / "t.o", tmp_path / "s.o"], tmp_path / "t", gtest_dir=Path("/g"))
    order = [str(tmp_path / "s.o"), "/g/libgmock.a", "-l:libtensorflow_framework.so.2"]
    assert [link.index(a) for a in order] == sorted(link.index(a) for a in order)
    assert f"-Wl,-rpath,{tmp_path / 'whl'}" in link


def test_object_key_follows_sources_and_headers_not_output_path():
    argv_a = ["g++", "-c", "x.cc", "-o", "/tmp/a.o"]
    argv_b = ["g++", "-c", "x.cc", "-o", "/tmp/b.o"]
    k = xlatest_plan.object_key(argv_a, b"int f();", [b"h1"])
    assert k == xlatest_plan.object_key(argv_b, b"int f();", [b"h1"])
    assert k != xlatest_plan.object_key(argv_a, b"int g();", [b"h1"])
    assert k != xlatest_plan.object_key(argv_a, b"int f();", [b"h2"])
    assert k != xlatest_plan.object_key(argv_a + ["-O2"], b"int f();", [b"h1"])


def test_wheel_pin_and_members():
    w = xlatest_plan.WHEEL
    assert w.filename == "tf_nightly-2.23.0.dev20261026-cp312-cp312-manylinux_2_27_x86_64.whl"
    argv = w.download_argv("py", Path("/d"))
    assert argv[:5] == ["py", "-m", "pip", "download", "--no-deps"] and argv[-1] == "tf-nightly==2.23.0.dev20261026"
    assert xlatest_plan.wheel_member_wanted("tensorflow/include/xla/shape.h")
    assert xlatest_plan.wheel_member_wanted("tensorflow/libtensorflow_framework.so.2")
    assert not xlatest_plan.wheel_member_wanted("tensorflow/libtensorflow_framework.so.2.x")
    assert not xlatest_plan.wheel_member_wanted("tensorflow/python/ops/array_ops.py")


def _patched_default_tree(tmp_path):
    tree = tmp_path / "tree"
    preimage_tree(DEFAULT_XLA[0].read_text(), tree)
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    for p in DEFAULT_XLA:
        subprocess.run(["git", "apply", str(p)], cwd=tree, check=True, capture_output=True)
    return tree


@pytest.mark.slow
def test_every_guard_is_in_its_patch_once_and_every_default_patch_has_guards(tmp_path):
    guards = xlatest_guards.load_guards()
    files = [p.file for p in SERIES.upstream("xla").select("default")]
    assert xlatest_guards.check_guards_cover(guards, files) == []
    assert {g.patch for g in guards} <= {p.file for p in SERIES.upstream("xla").patches}  # variants: [guard.at]
    tree = _patched_default_tree(tmp_path)
    for g in (g for g in guards if g.patch in files):  # a variant's guards: tests/upstream/test_xla_variants.py
        text = (tree / g.file).read_text()
        mutant = xlatest_guards.mutate(text, g)
        assert mutant != text, g.name
        # the guard's text is code the patch adds, not upstream context
        added = "".join(ln[1:] + "\n" for ln in Path(SERIES.root / g.patch).read_text().splitlines()
                        if ln.startswith("+") and not ln.startswith("+++"))
        assert re.sub(r"\s+", " ", g.find).strip() in re.sub(r"\s+", " ", added), g.name


def test_mutate_needs_exactly_one_occurrence():
    g = xlatest_guards.Guard("xla/0001-x.patch", "a.cc", "g", "if (x) return;", "")
    assert xlatest_guards.mutate("a; if (x) return; b;", g) == "a;  b;"
    for text in ("nothing", "if (x) return; if (x) return;"):
        with pytest.raises(HarnessError, match="occurs [02] times"):
            xlatest_guards.mutate(text, g)
    assert xlatest_guards.check_guards_cover([g], ["xla/0001-x.patch", "xla/0002-y.patch"]) == ["xla/0002-y.patch"]


def test_guards_file_errors(tmp_path):
    f = tmp_path / "guards.toml"
    f.write_text('[[guard]]\npatch = "p"\nfile = "f"\nname = "n"\n')
    with pytest.raises(HarnessError, match=r"guard\[0\] needs"):
        xlatest_guards.load_guards(f)
    f.write_text("[[guard]\n")
    with pytest.raises(HarnessError, match="malformed TOML"):
        xlatest_guards.load_guards(f)
    head = '[[guard]]\npatch = "p"\nfile = "f"\nname = "n"\nfind = "x"\n'
    for at, why in (('at = "v"\n', "must be a table"),
                    ('[guard.at."v"]\nfind = "y"\nabsent = "z"\n', "not both"),
                    ('[guard.at."v"]\nreplace = "y"\n', "needs either"),
                    ('[guard.at."v"]\nabsent = "z"\nreplace = ""\n', "not both"),
                    ('[guard.at."v"]\nfinds = "y"\n', "takes find and replace, or absent"),
                    ('[guard.at."v"]\nfind = 1\n', "are strings")):
        f.write_text(head + at)
        with pytest.raises(HarnessError, match=why):
            xlatest_guards.load_guards(f)
    f.write_text(head + '[guard.at."v"]\nfind = "y"\nreplace = "w"\n\n[[guard]]\npatch = "p"\nfile = "f"\n'
                 'name = "m"\nfind = "x"\n[guard.at."v"]\nabsent = "why"\n')
    first, second = xlatest_guards.load_guards(f)
    assert first.at_base("v") == xlatest_guards.GuardAt("y", "w", "") and first.at_base("u") is None
    assert second.at_base("v") == xlatest_guards.GuardAt(absent="why")


def test_guards_for_base_spells_each_guard_as_at_the_variants_base():
    patches = (Patch("xla/0001-a.patch", "", "default", ""), Patch("xla/0002-b.patch", "", "experimental", ""))
    up = Upstream("xla", "", "", "own", patches=patches, variants=(
        Variant("old", ("xla/old/0001-a.patch", ""), ""), Variant("same", ("xla/0001-a.patch", ""), "")))
    keep = xlatest_guards.Guard("xla/0001-a.patch", "a.cc", "kept", "k;", "")
    respelled = xlatest_guards.Guard("xla/0001-a.patch", "a.cc", "respelled", "f(x, info);", "",
                              (("old", xlatest_guards.GuardAt("f(x);", "g(x);")),))
    gone = xlatest_guards.Guard("xla/0001-a.patch", "a.cc", "hook", "hook();", "",
                         (("old", xlatest_guards.GuardAt(absent="no hook")),))
    exp = xlatest_guards.Guard("xla/0002-b.patch", "b.cc", "experimental", "e;", "")
    guards = [keep, respelled, gone, exp]
    assert xlatest_guards.guards_for_base(guards, up, None) == (guards, [])
    chosen, absent = xlatest_guards.guards_for_base(guards, up, "old")
    assert [(g.patch, g.name, g.find, g.replace) for g in chosen] == [
        ("xla/old/0001-a.patch", "kept", "k;", ""), ("xla/old/0001-a.patch", "respelled", "f(x);", "g(x);")]
    assert absent == [(gone, "no hook")]  # listed with its reason, not dropped; 0002 has no file there
    chosen, absent = xlatest_guards.guards_for_base(guards, up, "same")
    assert [(g.patch, g.find) for g in chosen] == [("xla/0001-a.patch", "k;"), ("xla/0001-a.patch", "f(x, info);"),
                                                  ("xla/0001-a.patch", "hook();")] and absent == []
    with pytest.raises(HarnessError, match="not a patch of the series"):
        xlatest_guards.guards_for_base([xlatest_guards.Guard("xla/old/0001-a.patch", "a.cc", "g", "k;", "")], up, "old")
    with pytest.raises(HarnessError, match="at.older is not a variant of the series"):
        xlatest_guards.guards_for_base([xlatest_guards.Guard("xla/0001-a.patch", "a.cc", "g", "k;", "",
                                               (("older", xlatest_guards.GuardAt("x;")),))], up, None)


@pytest.mark.parametrize("command", ["test", "mutants"])
def test_without_xla_src_is_not_a_pass(command, capsys):
    assert xlatest.main([command]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("not checked: no XLA_SRC")
    assert "passed" not in out


def _make(*args: str) -> subprocess.CompletedProcess:
    """make in this checkout without XLA_SRC; `-o setup` keeps make from running `setup` (which
    would rebuild .venv) at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in ("XLA_SRC", "SERIES")}
    return subprocess.run(["make", "--no-print-directory", "-o", "setup", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="not checked: no make on PATH")
def test_make_test_prints_not_checked_for_xla_without_xla_src():
    # `make test` (what CI runs) has xla-test and xla-mutants as prerequisites, before the suite
    plan = _make("-n", "test").stdout.splitlines()
    xla_test = next(i for i, line in enumerate(plan) if "xla_harness.upstream.xlatest test" in line)
    mutants = next(i for i, line in enumerate(plan) if "xla_harness.upstream.xlatest mutants" in line)
    suite = next(i for i, line in enumerate(plan) if line.strip().endswith("-m pytest -q"))
    assert xla_test < suite and mutants < suite
    assert "--xla-src" not in plan[xla_test] + plan[mutants]
    # and those two targets, run for real without XLA_SRC, say so and succeed
    res = _make("xla-test", "xla-mutants", f"PY={sys.executable}")
    assert res.returncode == 0, res.stderr
    assert "xla-test: not checked: no XLA_SRC" in res.stdout
    assert "xla-mutants: not checked: no XLA_SRC" in res.stdout


def test_bad_xla_src_is_one_error_line(tmp_path, capsys):
    assert xlatest.main(["test", "--xla-src", str(tmp_path / "nope"), "--cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: XLA_SRC") and "not a directory" in err[0]


def test_missing_gtest_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(xlatest_build, "GTEST_LIB_DIR", tmp_path / "nolibs")
    # --allow-dirty: whether this checkout has local changes is not what this test is about
    assert xlatest.main(["test", "--xla-src", str(tmp_path), "--cache", str(tmp_path), "--allow-dirty"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "apt-get install -y libgtest-dev libgmock-dev" in err[0]


@pytest.mark.slow
def test_prepare_tree_applies_the_series_and_can_keep_stock_sources(tmp_path):
    src = tmp_path / "xla-src"
    preimage_tree(DEFAULT_XLA[0].read_text(), src)
    (src / "xla/service/instruction_fusion.h").write_text("// header\n")
    wheel_inc = tmp_path / "inc"
    for f in xlatest_plan.SUPPORT_FILES:  # the wheel has every support header: nothing extra is copied
        (wheel_inc / f).parent.mkdir(parents=True, exist_ok=True)
        (wheel_inc / f).write_text("")
    units, support_cc = xlatest_build.prepare_tree(src, DEFAULT_XLA, tmp_path / "t", wheel_inc)
    assert [u.source for u in units] == ["xla/service/instruction_fusion.cc"] and support_cc == []
    patched = (tmp_path / "t/xla/service/instruction_fusion.cc").read_text()
    assert "in_place_op" in patched
    units, _ = xlatest_build.prepare_tree(src, DEFAULT_XLA, tmp_path / "s", wheel_inc, stock_sources=True)
    assert "in_place_op" not in (tmp_path / "s/xla/service/instruction_fusion.cc").read_text()
    assert "ScatterShouldNotFuseWithTransposeOfInPlaceOperand" in (
        tmp_path / "s/xla/service/instruction_fusion_test.cc").read_text()
    (src / "xla/service/instruction_fusion.h").unlink()
    with pytest.raises(HarnessError, match="instruction_fusion.h is not in the XLA tree"):
        xlatest_build.prepare_tree(src, DEFAULT_XLA, tmp_path / "u", wheel_inc)


def test_compare_decisions_counts_changed_pairs_only():
    stock = ("m1.before_fusion.txt\tscatter\ttranspose\tallow\n"
             "m1.before_fusion.txt\tscatter\tnegate\tallow\n"
             "/d/m2.before_fusion.txt\tdus\tslice\tallow\n"
             "unparsable\t/d/m3.txt\n")
    patched = stock.replace("scatter\ttranspose\tallow", "scatter\ttranspose\tforbid")
    radius = xlatest_blast.compare_decisions(stock, patched, modules=3)
    assert (radius.modules, radius.modules_with_pairs, radius.pairs) == (3, 2, 3)
    assert radius.changed == (("m1.before_fusion.txt", "scatter", "transpose", "allow", "forbid"),)
    assert xlatest_blast.compare_decisions(stock, stock, modules=3).changed == ()
    with pytest.raises(HarnessError, match="different pairs"):
        xlatest_blast.compare_decisions(stock, patched.replace("negate", "abs"), modules=3)


def test_blast_radius_without_modules_is_one_error(tmp_path, capsys):
    assert xlatest.main(["blast-radius", "--xla-src", str(tmp_path), "--modules", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no pre-fusion modules (*.before_fusion.txt" in err[0]


def test_blast_radius_takes_another_source_to_set_against_stock():
    args = xlatest.build_parser().parse_args(["blast-radius", "--xla-src", "x", "--modules", "m",
                                              "--sources-from", "out/gpu-rule"])
    assert args.sources_from == "out/gpu-rule"


def _gpu_rule_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("xla_gpu_rule_source", ROOT / "tools" / "xla_gpu_rule_source.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.slow
def test_the_gpu_rule_source_replaces_0001s_data_moving_check(tmp_path, capsys):
    """tools/xla_gpu_rule_source.py on a tree with 0001 applied: its data-moving check becomes GPU's
    rule (nothing fuses into the in-place operand); a tree without it is refused, one error line."""
    tool = _gpu_rule_tool()
    tree = tmp_path / "tree"
    for patch in DEFAULT_XLA:  # the files 0001 touches, as small as it applies to
        preimage_tree(patch.read_text(), tree)
    subprocess.run(["git", "apply", *map(str, DEFAULT_XLA)], cwd=tree, check=True, capture_output=True)
    assert tool.main([str(tree), str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / tool.SOURCE).read_text()
    assert tool.GPU_RULE in text and "FindDataMovingOp(producer" not in text
    assert tool.main([str(tmp_path / "out"), str(tmp_path / "again")]) == 2
    assert capsys.readouterr().err.startswith("error: ") and not (tmp_path / "again").exists()
