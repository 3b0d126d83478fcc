"""The pytest plugin (xla_harness.pytest_plugin): loading, prefixed markers, opt-in stress, JUnit properties."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from xla_harness.stress.report import stats

# Imported here, outside pytester's in-process runs: those drop the modules they import afterwards,
# and importing jax a second time in one process aborts it.
from xla_harness.stress.report import summary as report  # noqa: F401

PLUGIN = "xla_harness.pytest_plugin"
PLAIN_TEST = """
def test_plain():
    pass
"""


def _markers(res) -> str:
    return "\n".join(line for line in res.outlines if line.startswith("@pytest.mark."))


def test_entry_point_is_named_as_the_module():
    # pytest registers an entry-point plugin under the entry point's name; `-p MODULE` dedupes only
    # when that name is the module's. A stale editable install keeps the old name: reinstall.
    (ep,) = [ep for ep in entry_points(group="pytest11") if ep.value == PLUGIN]
    assert ep.name == PLUGIN


@pytest.mark.parametrize("autoload", [True, False], ids=["autoload", "no-autoload"])
def test_p_option_loads_the_plugin_once(pytester, monkeypatch, autoload):
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_plain=PLAIN_TEST)
    res = pytester.runpytest_inprocess("-p", PLUGIN)
    res.assert_outcomes(passed=1)
    res = pytester.runpytest_inprocess("-p", PLUGIN, "--markers")
    assert res.ret == 0 and "@pytest.mark.xla_harness_gpu:" in _markers(res)


def test_p_no_turns_it_off(pytester):
    pytester.makepyfile(test_plain=PLAIN_TEST)
    res = pytester.runpytest_inprocess("-p", f"no:{PLUGIN}", "--markers")
    assert res.ret == 0 and "xla_harness" not in _markers(res)


@pytest.mark.slow
@pytest.mark.parametrize("autoload", [True, False], ids=["autoload", "no-autoload"])
def test_p_option_on_a_real_command_line(pytester, monkeypatch, autoload):
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_plain=PLAIN_TEST)
    res = pytester.runpytest_subprocess("-p", PLUGIN, "--xla-harness-steps", "3")
    res.assert_outcomes(passed=1)
    assert "already registered" not in res.stderr.str()


def test_registers_only_prefixed_markers(pytester):
    pytester.makepyfile(test_plain=PLAIN_TEST)
    markers = _markers(pytester.runpytest_inprocess("--markers"))
    for name in ("cpu", "gpu", "tpu", "stress"):
        assert f"@pytest.mark.xla_harness_{name}:" in markers
    for generic in ("cpu", "gpu", "tpu", "stress", "slow"):
        assert f"@pytest.mark.{generic}:" not in markers


def test_users_own_gpu_marker_is_never_touched(pytester):
    pytester.makeini("""
        [pytest]
        markers =
            gpu: the user's own
            tpu: the user's own
            stress: the user's own
    """)
    pytester.makepyfile(test_user="""
        import pytest

        @pytest.mark.gpu
        def test_mine():
            pass

        @pytest.mark.tpu
        @pytest.mark.stress
        def test_also_mine():
            pass
    """)
    # Run (never skipped) on this CPU-only machine, no warning, no clash with the user's registrations.
    pytester.runpytest_inprocess("--strict-markers", "-W", "error").assert_outcomes(passed=2)


def test_prefixed_backend_markers(pytester):
    pytester.makepyfile(test_backends="""
        import pytest

        @pytest.mark.xla_harness_tpu
        def test_tpu():
            raise AssertionError("must be skipped without a TPU")

        @pytest.mark.xla_harness_cpu
        def test_cpu():
            pass
    """)
    res = pytester.runpytest_inprocess("-rs", "--strict-markers")
    res.assert_outcomes(passed=1, skipped=1)
    res.stdout.fnmatch_lines(["*no jax tpu backend on this machine (xla_harness_tpu)*"])


STRESS_TESTS = """
import pytest

TINY = dict(modes=("dense_only",), remats=(False,), vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8)

def test_clean(xla_harness_stress):
    table = xla_harness_stress(**TINY)
    assert table.rows[0].n == 2

def test_injected(xla_harness_stress):
    xla_harness_stress(inject_rate=1.0, **TINY)

@pytest.mark.xla_harness_stress
def test_marked_only():
    pass
"""


def test_stress_is_opt_in(pytester):
    pytester.makepyfile(test_stress_inner=STRESS_TESTS)
    res = pytester.runpytest_inprocess("-rs")
    res.assert_outcomes(skipped=3)
    res.stdout.fnmatch_lines(["*opt in with --xla-harness-stress*"])
    # Fixture users carry the marker, so -m deselects them.
    res = pytester.runpytest_inprocess("-m", "not xla_harness_stress")
    res.assert_outcomes(deselected=3)


def test_stress_opt_in_by_ini(pytester):
    pytester.makeini("[pytest]\nxla_harness_stress = true\n")
    pytester.makepyfile(test_marked="import pytest\n\n@pytest.mark.xla_harness_stress\ndef test_m():\n    pass\n")
    pytester.runpytest_inprocess().assert_outcomes(passed=1)


def _properties(junit: Path) -> dict[str, dict[str, str]]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        out[case.get("name")] = {p.get("name"): p.get("value") for p in case.iter("property")}
    return out


@pytest.mark.slow  # the run records the git commit (a subprocess)
def test_stress_runs_and_records_junit_properties(pytester):
    pytester.makepyfile(test_stress_inner=STRESS_TESTS)
    res = pytester.runpytest_inprocess("--xla-harness-stress", "--xla-harness-steps", "2",
                                       "--xla-harness-seeds", "1", "--junitxml", "junit.xml",
                                       "-W", "error::pytest.PytestWarning")
    res.assert_outcomes(passed=2, failed=1)
    res.stdout.fnmatch_lines(["*2 non-finite step(s):*", "*dense_only/remat=off/f32*",
                              "*whose NaN: none of the 2 non-finite steps was explained (planted by --inject*"])
    props = _properties(pytester.path / "junit.xml")
    clean, bad = props["test_clean"], props["test_injected"]
    assert (clean["xla_harness_nonfinite"], clean["xla_harness_steps"]) == ("0", "2")
    assert float(clean["xla_harness_rate"]) == 0.0
    assert math.isclose(float(clean["xla_harness_rate_upper95"]), stats.upper_bound(0, 2))  # 1 - 0.05**0.5
    assert (bad["xla_harness_nonfinite"], bad["xla_harness_rate"], bad["xla_harness_rate_upper95"]) == (
        "2", "1.0", "1.0")
    for p in (clean, bad):
        assert p["xla_harness_results"].endswith("stress.jsonl") and Path(p["xla_harness_results"]).is_file()
        assert p["xla_harness_origins"] == "{}"  # nothing failed, or only planted steps: nothing to explain
    assert props["test_marked_only"] == {}


WHOSE_TEST = f"""
def test_zero_over_zero(xla_harness_stress):
    xla_harness_stress(program="{Path(__file__).resolve().parents[1] / 'origin' / 'programs' / 'whose.py'}:make",
                       program_options={{"kind": "zero-over-zero"}}, steps=4)
"""


@pytest.mark.slow  # the run records the git commit (a subprocess)
def test_a_failing_stress_test_says_whose_nan_it_is(pytester):
    pytester.makepyfile(test_whose_inner=WHOSE_TEST)
    res = pytester.runpytest_inprocess("--xla-harness-stress", "--xla-harness-seeds", "1", "--junitxml", "junit.xml",
                                       "-W", "error::pytest.PytestWarning")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*1 non-finite step(s):*", "*whose NaN: 1 of 1 non-finite steps explained: 1 program*",
                              "*step 3: program:*div(0, 0) = NaN at *whose_losses.py:*"])
    assert _properties(pytester.path / "junit.xml")["test_zero_over_zero"]["xla_harness_origins"] == '{"program": 1}'

