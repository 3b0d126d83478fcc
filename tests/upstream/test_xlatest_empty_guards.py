"""Checks that must not pass by checking nothing: xla-mutants with a guard whose file has no unit test
(a clear error, not StopIteration)."""

from __future__ import annotations

import argparse

import pytest

from xla_harness.errors import HarnessError
from xla_harness.upstream import xlatest, xlatest_guards, xlatest_plan


def test_unit_for_names_the_guard_instead_of_stopiteration():
    unit = xlatest_plan.TestUnit("xla/a.cc", "xla/a.h", "xla/a_test.cc")
    assert xlatest.unit_for([unit], "xla/a.cc", "g") is unit
    with pytest.raises(HarnessError, match="guard g1 of p: no unit test is built with xla/b.cc"):
        xlatest.unit_for([unit], "xla/b.cc", "guard g1 of p")


def test_mutants_with_a_guard_in_a_file_without_a_unit_test(tmp_path, monkeypatch, capsys):
    guard = xlatest_guards.Guard("xla/0001.patch", "xla/b.cc", "g1", "keep();", "")
    (tmp_path / "xla").mkdir()
    (tmp_path / "xla" / "b.cc").write_text("keep();\n")

    class Series:
        patches = [argparse.Namespace(file="xla/0001.patch")]

        def upstream(self, name):
            return self

        def select(self, which, base_ref=None):
            return [argparse.Namespace(file="xla/0001.patch")]

    tc = argparse.Namespace(tree=tmp_path, wheel_lib_dir=tmp_path)
    unit = xlatest_plan.TestUnit("xla/a.cc", "xla/a.h", "xla/a_test.cc")
    monkeypatch.setattr(xlatest, "load_series", Series)
    monkeypatch.setattr(xlatest, "load_guards", lambda: [guard])
    monkeypatch.setattr(xlatest, "_setup", lambda args, series: (tc, [], [unit], [], tmp_path))
    monkeypatch.setattr(xlatest, "describe", lambda *a: [])
    monkeypatch.setattr(xlatest, "_resolve_base", lambda args, series: setattr(args, "base_ref", None))
    with pytest.raises(HarnessError, match="guard g1 of xla/0001.patch: no unit test is built with xla/b.cc"):
        xlatest.cmd_mutants(argparse.Namespace(xla_src=str(tmp_path)))
    assert (tmp_path / "xla" / "b.cc").read_text() == "keep();\n"  # the tree was left unmutated
