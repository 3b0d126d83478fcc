"""Checks that must not pass by checking nothing: patches-check against a tree where no patch can
be checked. (xla-mutants with a guard whose file has no unit test: tests/upstream/test_xlatest_empty_guards.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_harness.cli import main
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
