"""The jax-suite runner: junit parsing, flag off/on differences, the patched test tree, and a real
pytest run per flag value (a stand-in test file that reads the env var the patched config reads)."""

import sys
import unittest
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.upstream import jaxsuite
from xla_harness.upstream.patchfile import preimage_tree

ROOT = Path(__file__).resolve().parent.parent
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
