"""A check that checks nothing is not a pass: each planted empty case (no test ran, nothing
selected, nothing installed) ends in one ``error:`` line and exit 2, never exit 0."""

from __future__ import annotations

import types

from xla_harness.cli import main
from xla_harness.gradcheck import cross
from xla_harness.upstream import xlatest, xlatest_build, xlatest_gtest, xlatest_plan

# ----------------------------------------------------------------------------- xla-test

UNIT = xlatest_plan.TestUnit("xla/service/a.cc", "xla/service/a.h", "xla/service/a_test.cc")


def _fake_xla(monkeypatch, tmp_path, units, output, returncode=0):
    tc = types.SimpleNamespace(wheel_lib_dir=tmp_path)
    monkeypatch.setattr(xlatest, "_setup", lambda args, series: (tc, [], units, [], tmp_path))
    monkeypatch.setattr(xlatest, "describe", lambda *a: [])
    def build_and_run(tc, unit, support, work, log, filt=""):
        return xlatest_build.UnitRun(unit, xlatest_gtest.parse_gtest(output), returncode, output)

    monkeypatch.setattr(xlatest, "build_and_run", build_and_run)


ZERO_RAN = ("[==========] Running 0 tests from 0 test suites.\n"
            "[==========] 0 tests from 0 test suites ran. (0 ms total)\n")
ONE_PASSED = "[ RUN      ] A.B\n[       OK ] A.B (1 ms)\n"


def test_xla_test_where_no_test_ran_fails(tmp_path, monkeypatch, capsys):
    _fake_xla(monkeypatch, tmp_path, [UNIT], ZERO_RAN)
    assert xlatest.main(["test", "--xla-src", str(tmp_path), "--filter", "Nope.*"]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == ["error: xla-test: no test ran in a_test (--filter 'Nope.*')"]
    assert "no tests: 0 tests" in out


def test_xla_test_with_no_unit_to_run_fails(tmp_path, monkeypatch, capsys):
    _fake_xla(monkeypatch, tmp_path, [], ONE_PASSED)
    assert xlatest.main(["test", "--xla-src", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: series 'default' patches no XLA source with a unit test: nothing to run"]


def test_xla_test_that_ran_tests_still_passes_and_fails(tmp_path, monkeypatch, capsys):
    _fake_xla(monkeypatch, tmp_path, [UNIT], ONE_PASSED)
    assert xlatest.main(["test", "--xla-src", str(tmp_path)]) == 0
    _fake_xla(monkeypatch, tmp_path, [UNIT], "[ RUN      ] A.B\n[  FAILED  ] A.B (1 ms)\n", 1)
    assert xlatest.main(["test", "--xla-src", str(tmp_path)]) == 1
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- gradcheck

def test_gradcheck_selection_with_no_defined_mode_fails(capsys):
    # while loops are forward-only: in eager and jit every cell would be SKIP
    assert main(["gradcheck", "--cases", "while_", "--modes", "eager,jit"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: nothing to check: the cases selected (while_")


def _fake_framework(name, why="", gradient=None):
    def no_gradient(case, mode, x):
        raise cross.Unsupported("no such op")

    return types.SimpleNamespace(NAME=name, available=lambda: why, version=lambda: "0", modes=lambda: ("m",),
                                 gradient=gradient or no_gradient)


def test_gradcheck_cross_with_no_framework_installed_fails(monkeypatch, capsys):
    monkeypatch.setattr(cross, "adapter", lambda name: _fake_framework(name, why=f"cannot import {name}"))
    assert main(["gradcheck", "--framework", "tf,mlx", "--cases", "where_sqrt"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: nothing checked: none of the frameworks named is installed")


def test_gradcheck_cross_where_every_cell_is_n_a_fails(monkeypatch, capsys):
    monkeypatch.setattr(cross, "adapter", lambda name: _fake_framework(name))
    assert main(["gradcheck", "--framework", "tf,mlx", "--cases", "where_sqrt"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "every cell of the cases selected (where_sqrt" in err[0]


# ----------------------------------------------------------------------------- scan

def test_scan_of_a_folder_without_hlo_fails(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not HLO\n")
    assert main(["scan", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "directory holds no HLO text" in err[0]
