"""The jax-suite runner: junit parsing, flag off/on differences, the patched test tree, and a real
pytest run per flag value (a stand-in test file that reads the env var the patched config reads)."""

import sys
import unittest
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.upstream import jaxsuite
from xla_harness.upstream.patchfile import preimage_tree

ROOT = Path(__file__).resolve().parents[2]
P0002 = ROOT / "patches/jax/0002-tests-zero-cotangent-masking.patch"

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.nn_test.NNTest" name="testOk" time="0.1"/>
<testcase classname="tests.nn_test.NNTest" name="testBad" time="0.1"><failure message="x">tb</failure></testcase>
<testcase classname="tests.nn_test.NNTest" name="testSkip" time="0"><skipped message="gpu"/></testcase>
<testcase classname="tests.nn_test.NNTest" name="testBad" time="0.1"><error message="teardown">tb</error></testcase>
<testcase classname="tests.nn_test.NNTest" name="testErr" time="0.1"><error message="setup">tb</error></testcase>
</testsuite></testsuites>"""


def test_parse_junit_keeps_the_worse_outcome_of_a_test_reported_twice():
    got = jaxsuite.parse_junit(JUNIT, "nn_test.py")
    assert got == {"nn_test.py::NNTest::testOk": "passed", "nn_test.py::NNTest::testBad": "failed",
                   "nn_test.py::NNTest::testSkip": "skipped", "nn_test.py::NNTest::testErr": "error"}


def test_differences_and_table_name_every_changed_test():
    off = jaxsuite.FileRun("a_test.py", None, "off", {"a::T::x": "passed", "a::T::y": "passed", "a::T::z": "skipped"})
    on = jaxsuite.FileRun("a_test.py", None, "on", {"a::T::x": "passed", "a::T::y": "failed", "a::T::w": "passed"})
    assert jaxsuite.differences(off, on) == [("a::T::w", "absent", "passed"), ("a::T::y", "passed", "failed"),
                                             ("a::T::z", "skipped", "absent")]
    table = jaxsuite.render_table({("a_test.py", "off"): off, ("a_test.py", "on"): on})
    assert "| a_test.py | all | 2/0/0/1 | 2/1/0/0 | 3 |" in table
    assert "- `a::T::y`: passed -> failed" in table
    same = jaxsuite.render_table({("a_test.py", "off"): off, ("a_test.py", "on"): off})
    assert "No test outcome differs" in same


def _fake_jax_tree(root: Path) -> Path:
    preimage_tree(P0002.read_text(), root)  # the smallest tests/lax_autodiff_test.py 0002 applies to
    (root / "tests" / "api_test.py").write_text(
        jaxsuite.API_TEST_IMPORT)
    return root


@pytest.mark.slow
def test_prepare_tests_applies_0002_and_the_import_adaptation(tmp_path):
    src = _fake_jax_tree(tmp_path / "jax")
    applied = jaxsuite.prepare_tests(src, tmp_path / "out")
    assert applied[0] == "jax/0002-tests-zero-cotangent-masking.patch"
    assert "class ZeroCotangentMaskingTest" in (tmp_path / "out/tests/lax_autodiff_test.py").read_text()
    assert (src / "tests/api_test.py").read_text() == jaxsuite.API_TEST_IMPORT  # the source tree is left alone
    # The adapted import runs against the jax of this venv (0.12.0.1 lacks custom_remat and
    # SaveOnlyTheseNames): the tests that call custom_remat skip instead of the file failing to import.
    namespace: dict = {}
    exec(compile((tmp_path / "out/tests/api_test.py").read_text(), "api_test.py", "exec"), namespace)
    import jax._src.ad_checkpoint as ad_checkpoint
    if not hasattr(ad_checkpoint, "custom_remat"):
        with pytest.raises(unittest.SkipTest, match="custom_remat is not in the jax under test"):
            namespace["custom_remat"](abs, None, None, None)
        assert not isinstance(object(), namespace["SaveOnlyTheseNames"])


def test_prepare_tests_refuses_a_tree_without_jax_tests(tmp_path):
    with pytest.raises(HarnessError, match="not a jax source tree"):
        jaxsuite.prepare_tests(tmp_path, tmp_path / "out")


def test_main_reports_bad_input_in_one_line(tmp_path, capsys):
    assert jaxsuite.main(["--jax-src", str(tmp_path), "--files", "nope_test.py"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --files: nope_test.py is not in the suite (" +
                                               ", ".join(e.file for e in jaxsuite.SUITE) + ")")


FLAG_READER = """import os

def test_flag_value_reaches_the_test():
    assert os.environ["JAX_ZERO_COTANGENT_MASKING"] == "0"

def test_generated_cases():
    assert os.environ["JAX_NUM_GENERATED_CASES"] == "3"

def test_devices():
    assert "xla_force_host_platform_device_count=8" in os.environ["XLA_FLAGS"]
"""


@pytest.mark.slow
def test_run_file_runs_pytest_once_per_flag_and_finds_the_difference(tmp_path):
    (tmp_path / "src/tests").mkdir(parents=True)
    (tmp_path / "src/tests/pjit_test.py").write_text(FLAG_READER)
    entry = jaxsuite.SuiteFile("pjit_test.py", "flag or cases or devices", devices=8)
    runs = {flag: jaxsuite.run_file(sys.executable, tmp_path / "src", entry, flag, tmp_path / "res", 3, 300)
            for flag in jaxsuite.FLAGS}
    assert runs["off"].counts() == {"passed": 3, "failed": 0, "error": 0, "skipped": 0}
    assert runs["on"].counts() == {"passed": 2, "failed": 1, "error": 0, "skipped": 0}
    assert jaxsuite.differences(runs["off"], runs["on"]) == [
        ("pjit_test.py::pjit_test::test_flag_value_reaches_the_test", "passed", "failed")]
    assert (tmp_path / "res/on/pjit_test.xml").is_file()
    # a later invocation with --flags on reads the flag-off results back from the junit file
    assert jaxsuite.earlier_run(tmp_path / "res", entry, "off").outcomes == runs["off"].outcomes
    assert jaxsuite.earlier_run(tmp_path / "res", jaxsuite.SuiteFile("nn_test.py"), "off") is None


def test_main_refuses_unknown_flag_values(tmp_path, capsys):
    assert jaxsuite.main(["--jax-src", str(tmp_path), "--flags", "maybe"]) == 2
    assert capsys.readouterr().err.startswith("error: --flags must name off and/or on")


# A file whose runs produced no comparable outcomes is "not compared", never "no difference".

def _run(file, flag, outcomes=None, note=""):
    return jaxsuite.FileRun(file, None, flag, dict(outcomes or {}), note=note)


SAME = {"nn_test.py::T::a": "passed", "nn_test.py::T::b": "skipped"}


def _main_with_runs(tmp_path, monkeypatch, planted, *extra):
    """jaxsuite.main with prepare_tests and run_file faked: ``planted`` maps (file, flag) -> FileRun."""
    monkeypatch.setattr(jaxsuite, "prepare_tests", lambda src, dest: [])

    def fake_run_file(python, src, entry, flag, out, cases, timeout):
        return planted[(entry.file, flag)]

    monkeypatch.setattr(jaxsuite, "run_file", fake_run_file)
    files = ",".join(dict.fromkeys(f for f, _ in planted))
    return jaxsuite.main(["--jax-src", str(tmp_path), "--python", sys.executable, "--out", str(tmp_path / "out"),
                          "--files", files, *extra])


@pytest.mark.parametrize("off,on,why", [
    (_run("nn_test.py", "off", note="timeout after 1800 s"), _run("nn_test.py", "on", note="timeout after 1800 s"),
     "flag off: timeout after 1800 s; flag on: timeout after 1800 s"),
    (_run("nn_test.py", "off", {"nn_test.py::::tests.nn_test": "error"}, note="collection error in tests.nn_test"),
     _run("nn_test.py", "on", {"nn_test.py::::tests.nn_test": "error"}, note="collection error in tests.nn_test"),
     "flag off: collection error in tests.nn_test; flag on: collection error in tests.nn_test"),
    (_run("nn_test.py", "off"), _run("nn_test.py", "on"), "flag off: no tests ran; flag on: no tests ran"),
    (_run("nn_test.py", "off", SAME), _run("nn_test.py", "on", note="timeout after 5 s"),
     "flag on: timeout after 5 s"),
    (_run("nn_test.py", "off", {"nn_test.py::T::a": "skipped"}),
     _run("nn_test.py", "on", {"nn_test.py::T::a": "skipped"}),
     "flag off: no tests ran (all 1 skipped); flag on: no tests ran (all 1 skipped)"),
])
def test_a_file_without_comparable_outcomes_fails_and_is_named(tmp_path, monkeypatch, capsys, off, on, why):
    planted = {("lax_autodiff_test.py", "off"): _run("lax_autodiff_test.py", "off", {"l::T::x": "passed"}),
               ("lax_autodiff_test.py", "on"): _run("lax_autodiff_test.py", "on", {"l::T::x": "passed"}),
               ("nn_test.py", "off"): off, ("nn_test.py", "on"): on}
    assert _main_with_runs(tmp_path, monkeypatch, planted) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"error: jax-suite: not compared (no test outcome known): nn_test.py ({why})"]
    assert "| nn_test.py | all |" in out and "| not compared |" in out
    assert f"- nn_test.py: {why}" in out
    assert "| lax_autodiff_test.py | all | 1/0/0/0 | 1/0/0/0 | 0 |" in out
    assert "No test outcome differs between flag off and flag on.\n" not in out
    assert "not compared" in (tmp_path / "out/table.md").read_text()


def test_every_file_timing_out_is_not_a_success(tmp_path, monkeypatch, capsys):
    planted = {(e.file, flag): _run(e.file, flag, note="timeout after 1800 s")
               for e in jaxsuite.SUITE for flag in jaxsuite.FLAGS}
    assert _main_with_runs(tmp_path, monkeypatch, planted) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and all(e.file in err for e in jaxsuite.SUITE)
    assert "No test outcome differs" not in out


def test_a_flag_value_without_results_is_not_compared(tmp_path, monkeypatch, capsys):
    # --flags off and no earlier flag-on results in OUT: nothing to compare with
    planted = {("nn_test.py", "off"): _run("nn_test.py", "off", SAME)}
    assert _main_with_runs(tmp_path, monkeypatch, planted, "--flags", "off") == 2
    assert "nn_test.py (flag on: no results)" in capsys.readouterr().err


def test_a_real_difference_is_still_reported_and_a_clean_run_passes(tmp_path, monkeypatch, capsys):
    differ = {("nn_test.py", "off"): _run("nn_test.py", "off", SAME),
              ("nn_test.py", "on"): _run("nn_test.py", "on", {**SAME, "nn_test.py::T::a": "failed"})}
    assert _main_with_runs(tmp_path, monkeypatch, differ) == 1
    out, err = capsys.readouterr()
    assert "- `nn_test.py::T::a`: passed -> failed" in out and err == ""
    clean = {("nn_test.py", "off"): _run("nn_test.py", "off", SAME),
             ("nn_test.py", "on"): _run("nn_test.py", "on", SAME)}
    assert _main_with_runs(tmp_path, monkeypatch, clean) == 0
    out, err = capsys.readouterr()
    assert "No test outcome differs between flag off and flag on." in out and err == ""


def test_earlier_results_with_a_collection_error_are_not_compared(tmp_path):
    xml = tmp_path / "off/nn_test.xml"
    xml.parent.mkdir()
    xml.write_text('<testsuites><testsuite name="pytest"><testcase classname="" name="tests.nn_test">'
                   '<error message="collection failure">ImportError</error></testcase></testsuite></testsuites>')
    run = jaxsuite.earlier_run(tmp_path, jaxsuite.SuiteFile("nn_test.py"), "off")
    assert run.problem() == "collection error in tests.nn_test"
    xml.write_text('<testsuites><testsuite name="pytest" tests="0"/></testsuites>')
    assert jaxsuite.earlier_run(tmp_path, jaxsuite.SuiteFile("nn_test.py"), "off").problem() == "no tests ran"
    xml.write_text("<testsuites><testsu")
    assert "unreadable results" in jaxsuite.earlier_run(tmp_path, jaxsuite.SuiteFile("nn_test.py"), "off").problem()


@pytest.mark.slow
def test_run_file_notes_a_timeout_a_collection_error_and_an_empty_selection(tmp_path):
    (tmp_path / "src/tests").mkdir(parents=True)
    (tmp_path / "src/tests/nn_test.py").write_text("import module_that_is_not_there_xyz\n")
    (tmp_path / "src/tests/api_test.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "src/tests/lax_test.py").write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    broken = jaxsuite.run_file(sys.executable, tmp_path / "src", jaxsuite.SuiteFile("nn_test.py"), "off",
                               tmp_path / "res", 3, 300)
    assert broken.problem() == "collection error in tests.nn_test"
    empty = jaxsuite.run_file(sys.executable, tmp_path / "src", jaxsuite.SuiteFile("api_test.py", "nomatch"),
                              "off", tmp_path / "res", 3, 300)
    assert empty.problem() == "no tests ran"
    slow = jaxsuite.run_file(sys.executable, tmp_path / "src", jaxsuite.SuiteFile("lax_test.py"), "off",
                             tmp_path / "res", 3, 3)
    assert slow.problem() == "timeout after 3 s"
