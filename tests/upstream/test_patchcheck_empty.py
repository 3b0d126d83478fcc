"""Checks that must not pass by checking nothing: patches-check against a tree where no patch can
be checked, and xla-mutants with a guard whose file has no unit test (a clear error, not
StopIteration)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.upstream import xlatest
from xla_harness.upstream.patchcheck import CheckResult, nothing_checked

PATCH = """\
diff --git a/src/a.txt b/src/a.txt
--- a/src/a.txt
+++ b/src/a.txt
@@ -1 +1 @@
-old
+new
diff --git a/tests/b_test.txt b/tests/b_test.txt
--- a/tests/b_test.txt
+++ b/tests/b_test.txt
@@ -1 +1 @@
-old
+new
"""


def _series(tmp_path: Path) -> Path:
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "0001.patch").write_text(PATCH)
    series = tmp_path / "series.toml"
    series.write_text('schema = 1\n\n[upstream.jax]\nclone_url = "u"\nbase = "b"\nbase_ref = "r"\n\n'
                      '[[upstream.jax.patches]]\nfile = "jax/0001.patch"\npurpose = "p"\nseries = "default"\n'
                      'status = "s"\nlinks = []\nvalidate = []\nbazel_targets = []\n')
    return series


def test_nothing_checked_rule():
    applies = CheckResult("jax", "applies", "p")
    unchecked = CheckResult("jax", "not checked", "p: tests/b is not in the given tree")
    assert nothing_checked("jax", None, [unchecked]) is None  # no tree given: nothing was asked
    assert nothing_checked("jax", Path("t"), [applies, unchecked]) is None
    assert "no patch was checked against t (p: tests/b" in nothing_checked("jax", Path("t"), [unchecked])
    assert "(no patches)" in nothing_checked("jax", Path("t"), [])


@pytest.mark.slow  # git
def test_a_tree_where_every_patch_is_not_checked_fails(tmp_path, capsys):
    series = _series(tmp_path)
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.txt").write_text("old\n")  # the sdist case: the source, not its tests/
    assert main(["patches-check", "--series-file", str(series), "--jax-src", str(tree)]) == 2
    captured = capsys.readouterr()
    assert "jax: not checked: jax/0001.patch: tests/b_test.txt is not in the given tree" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: jax: no patch was checked against")
    assert main(["patches-check", "--json", "--series-file", str(series), "--jax-src", str(tree)]) == 2
    assert '"error": "jax: no patch was checked against' in capsys.readouterr().out
    (tree / "tests").mkdir()
    (tree / "tests" / "b_test.txt").write_text("old\n")
    assert main(["patches-check", "--series-file", str(series), "--jax-src", str(tree)]) == 0
    assert "jax: applies: jax/0001.patch" in capsys.readouterr().out


def test_unit_for_names_the_guard_instead_of_stopiteration():
    unit = xlatest.TestUnit("xla/a.cc", "xla/a.h", "xla/a_test.cc")
    assert xlatest.unit_for([unit], "xla/a.cc", "g") is unit
    with pytest.raises(HarnessError, match="guard g1 of p: no unit test is built with xla/b.cc"):
        xlatest.unit_for([unit], "xla/b.cc", "guard g1 of p")


def test_mutants_with_a_guard_in_a_file_without_a_unit_test(tmp_path, monkeypatch, capsys):
    guard = xlatest.Guard("xla/0001.patch", "xla/b.cc", "g1", "keep();", "")
    (tmp_path / "xla").mkdir()
    (tmp_path / "xla" / "b.cc").write_text("keep();\n")

    class Series:
        patches = [argparse.Namespace(file="xla/0001.patch")]

        def upstream(self, name):
            return self

        def select(self, which, base_ref=None):
            return [argparse.Namespace(file="xla/0001.patch")]

    tc = argparse.Namespace(tree=tmp_path, wheel_lib_dir=tmp_path)
    unit = xlatest.TestUnit("xla/a.cc", "xla/a.h", "xla/a_test.cc")
    monkeypatch.setattr(xlatest, "load_series", Series)
    monkeypatch.setattr(xlatest, "load_guards", lambda: [guard])
    monkeypatch.setattr(xlatest, "_setup", lambda args, series: (tc, [], [unit], [], tmp_path))
    monkeypatch.setattr(xlatest, "describe", lambda *a: [])
    monkeypatch.setattr(xlatest, "_resolve_base", lambda args, series: setattr(args, "base_ref", None))
    with pytest.raises(HarnessError, match="guard g1 of xla/0001.patch: no unit test is built with xla/b.cc"):
        xlatest.cmd_mutants(argparse.Namespace(xla_src=str(tmp_path)))
    assert (tmp_path / "xla" / "b.cc").read_text() == "keep();\n"  # the tree was left unmutated
