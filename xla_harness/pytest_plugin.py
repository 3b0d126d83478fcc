"""pytest plugin: stress runs as ordinary test cases.

Installed with the package (entry point ``pytest11`` named ``xla_harness.pytest_plugin``, the
module's own name, so ``-p xla_harness.pytest_plugin`` works whether or not autoloading
already registered it, and ``-p no:xla_harness.pytest_plugin`` turns it off).

Everything it adds is prefixed, so it never collides with a project's own names:

* markers ``xla_harness_cpu``, ``xla_harness_gpu``, ``xla_harness_tpu`` skip a test unless jax
  sees that backend; ``xla_harness_stress`` marks a stress test (skipped unless opted in).
  Tests without these markers are never touched (a project's own ``gpu`` marker included).
* the ``xla_harness_stress`` fixture runs a stress matrix in ``tmp_path`` and fails the test,
  with the table in its message, when any step was non-finite. It is opt-in: without
  ``--xla-harness-stress`` (or ``xla_harness_stress = true`` in the ini file) it skips::

      def test_full_remat(xla_harness_stress):
          xla_harness_stress(modes=("full",), remats=(True,))

  It takes any :class:`~xla_harness.stress.spec.StressSpec` field, e.g.
  ``program="my_model.py:program"`` with ``program_options={"width": 512}``, and returns the
  table. Each call adds test properties (``item.user_properties``, as ``record_property`` does;
  ``--junitxml`` writes them per testcase, failed ones included): ``xla_harness_nonfinite``,
  ``xla_harness_steps``, ``xla_harness_rate`` (non-finite / total steps, all configurations and
  seeds pooled), ``xla_harness_rate_upper95`` (its one-sided exact 95% upper bound,
  :func:`xla_harness.stress.report.stats.upper_bound`), ``xla_harness_results`` (the results file) and
  ``xla_harness_origins`` (how many explained failing steps each origin class holds, JSON). A failing
  run says whose each of its first failing steps' NaN is (``stress --explain``: input, race,
  program, precision, compiler or unknown, with the file:line where the program made it);
  ``explain=False`` leaves that out.
* the ``xla_harness_triage`` fixture runs ``xla-harness triage`` (every verdict about a step, per
  compiler: :mod:`xla_harness.triage`) in ``tmp_path`` and fails the test, with the answer paragraph
  in its message, when the triage finds anything (a hazard, non-finite steps, nondeterminism);
  opt-in like the stress fixture. It takes the command's options as keywords and returns the answer::

      def test_no_hazard_on_tpu(xla_harness_triage):
          xla_harness_triage(program="my_model.py:make", target="host,tpu:v6e:2x4", budget=5)

* options ``--xla-harness-steps``, ``--xla-harness-seeds`` size every fixture run;
  ``--xla-harness-program`` sets the program of every run that names none.

jax is imported only when a test uses one of these markers or the fixture.
"""

from __future__ import annotations

import functools
import json

import pytest

PREFIX = "xla_harness"
BACKENDS = ("cpu", "gpu", "tpu")
STRESS = f"{PREFIX}_stress"  # marker, fixture and ini option
TRIAGE = f"{PREFIX}_triage"  # fixture (opted in as the stress fixture)
OPT_IN = "--xla-harness-stress"
SKIP_REASON = f"xla-harness stress test: opt in with {OPT_IN} (or ini option {STRESS} = true)"
CONFIDENCE = 0.95


def pytest_addoption(parser) -> None:
    group = parser.getgroup("xla-harness", "xla-harness stress tests")
    group.addoption(OPT_IN, action="store_true", default=None,
                    help=f"run stress tests (the {STRESS} fixture and marker); they skip without it")
    group.addoption("--xla-harness-steps", type=int, default=20, metavar="N",
                    help="steps per (config, seed) of every xla_harness_stress run (default 20)")
    group.addoption("--xla-harness-seeds", default="1,2", metavar="S1,S2",
                    help="comma-separated seeds of every xla_harness_stress run (default 1,2)")
    group.addoption("--xla-harness-program", default=None, metavar="PROGRAM",
                    help="program of xla_harness_stress runs that name none (built-in name, FILE.py:NAME, "
                         "MODULE:NAME)")
    parser.addini(STRESS, type="bool", default=False,
                  help=f"run xla-harness stress tests (as {OPT_IN})")


def pytest_configure(config) -> None:
    for name in BACKENDS:
        config.addinivalue_line(
            "markers", f"{PREFIX}_{name}: needs a jax {name.upper()} backend (skipped without one)")
    config.addinivalue_line("markers", f"{STRESS}: an xla-harness stress run (skipped unless {OPT_IN})")


def _stress_enabled(config) -> bool:
    flag = config.getoption(OPT_IN)
    return bool(config.getini(STRESS)) if flag is None else flag


@functools.cache
def _has_backend(name: str) -> bool:
    import jax

    try:
        return len(jax.devices(name)) > 0
    except RuntimeError:  # unknown backend, or one that failed to initialise
        return False


def pytest_collection_modifyitems(config, items) -> None:
    # Tests that use the fixture carry the marker too, so -m / -m "not xla_harness_stress" select them.
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if uses & {STRESS, TRIAGE} and item.get_closest_marker(STRESS) is None:
            item.add_marker(STRESS)


def pytest_runtest_setup(item) -> None:
    for name in BACKENDS:
        if item.get_closest_marker(f"{PREFIX}_{name}") is not None and not _has_backend(name):
            pytest.skip(f"no jax {name} backend on this machine ({PREFIX}_{name})")
    if item.get_closest_marker(STRESS) is not None and not _stress_enabled(item.config):
        pytest.skip(SKIP_REASON)


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise pytest.UsageError(f"--xla-harness-seeds must be comma-separated integers, got {text!r}") from None


@pytest.fixture
def xla_harness_stress(request, tmp_path):
    """Run a stress matrix (any StressSpec field as keyword); fail with the table when any step is
    non-finite. Returns the table. Skips unless --xla-harness-stress."""
    config = request.config
    if not _stress_enabled(config):
        pytest.skip(SKIP_REASON)
    from xla_harness.stress.explain import ExplainSpec
    from xla_harness.stress.report import stats
    from xla_harness.stress.report import summary as report
    from xla_harness.stress.runner import run_matrix
    from xla_harness.stress.spec import StressSpec

    steps = config.getoption("--xla-harness-steps")
    seeds = _seeds(config.getoption("--xla-harness-seeds"))
    program = config.getoption("--xla-harness-program")
    calls = 0

    def record(name: str, value) -> None:
        # What record_property does, without its warning under the default junit_family (xunit2):
        # that warning on every stress test would turn into an error under -W error.
        request.node.user_properties.append((f"{PREFIX}_{name}", value))

    def run(explain: bool = True, **overrides):
        nonlocal calls
        if "program_options" in overrides:
            overrides["program_options"] = tuple(sorted(dict(overrides["program_options"]).items()))
        defaults = {"steps": steps, "seeds": seeds, **({"program": program} if program else {})}
        spec = StressSpec(**{**defaults, **overrides})
        out = tmp_path / f"{STRESS}{calls}"
        calls += 1
        path = run_matrix(spec, out, explain=ExplainSpec() if explain else None)
        table = report.load_table([out])
        k, n = table.total_nonfinite, sum(r.n for r in table.rows)
        origins = report.load_origins([out]) if explain else []
        record("nonfinite", k)
        record("steps", n)
        record("rate", k / n if n else 0.0)
        record("rate_upper95", stats.upper_bound(k, n, CONFIDENCE))
        record("results", str(path))
        if explain:
            record("origins", json.dumps(report.origin_counts(origins), sort_keys=True))
        if k:
            whose = f"\n{report.format_origins(origins, k)}" if explain else ""
            pytest.fail(f"{k} non-finite step(s):\n{report.format_table(table)}{whose}", pytrace=False)
        return table

    return run


@pytest.fixture
def xla_harness_triage(request, tmp_path):
    """Run ``xla-harness triage`` (keywords: its options, ``program_option`` a list of ``KEY=VALUE``);
    fail with the answer when it finds anything. Returns the answer
    (:class:`xla_harness.triage.answer_record.Answer`). Skips unless --xla-harness-stress."""
    if not _stress_enabled(request.config):
        pytest.skip(SKIP_REASON)
    from xla_harness.triage.render import write_report
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec, budget_seconds

    calls = 0

    def run(program: str, target: str = "host", budget: float = 10.0, program_option=(), hlo=(),
            rate_of_interest: float = 0.05):
        nonlocal calls
        out = tmp_path / f"{TRIAGE}{calls}"
        calls += 1
        spec = TriageSpec(program=program, options=list(program_option),
                          targets=[t.strip() for t in target.split(",") if t.strip()], hlo=[str(h) for h in hlo],
                          budget_s=budget_seconds(budget), rate_of_interest=rate_of_interest)
        state, _ = Triage(spec, out).run()
        ans = write_report(out, state)
        request.node.user_properties.append((f"{PREFIX}_triage_report", str(out / "report.html")))
        if ans.exit_code == 2:
            pytest.fail(f"xla-harness triage: {ans.not_clean()}: {ans.paragraph}", pytrace=False)
        if ans.exit_code:
            pytest.fail(f"xla-harness triage found: {ans.text()}", pytrace=False)
        return ans

    return run
