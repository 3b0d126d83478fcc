"""pytest plugin (entry point ``pytest11``): stress tests as ordinary test cases.

Markers ``cpu``, ``gpu``, ``tpu`` skip a test unless jax sees that backend; ``stress``
marks long runs. The ``harness_stress`` fixture runs a stress matrix in ``tmp_path`` and
fails the test, with the table in its message, when any step was non-finite::

    @pytest.mark.stress
    def test_full_remat(harness_stress):
        harness_stress(modes=("full",), remats=(True,))

It takes any :class:`~xla_harness.stress.runner.StressSpec` field, e.g. ``program="my_model.py:program"``
(your own TrainProgram, as ``--program`` names it) with ``program_options={"width": 512}``.
``--stress-steps`` and ``--stress-seeds`` size every such run from the command line;
``--stress-program`` sets the program of every run that names none.
"""

from __future__ import annotations

import pytest

BACKEND_MARKERS = ("cpu", "gpu", "tpu")


def pytest_addoption(parser) -> None:
    group = parser.getgroup("xla-harness")
    group.addoption("--stress-steps", type=int, default=20, help="steps per (config, seed) in stress tests")
    group.addoption("--stress-seeds", default="1,2", help="comma-separated seeds for stress tests")
    group.addoption("--stress-program", default=None, metavar="PROGRAM",
                    help="program of harness_stress runs that name none (built-in name, FILE.py:NAME, MODULE:NAME)")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "cpu: needs the jax CPU backend")
    config.addinivalue_line("markers", "gpu: needs a jax GPU backend (skipped without one)")
    config.addinivalue_line("markers", "tpu: needs a jax TPU backend (skipped without one)")
    config.addinivalue_line("markers", "stress: a stress run (repeated training steps)")
    config.addinivalue_line("markers", "slow: an end-to-end test in subprocesses")


def _has_backend(name: str) -> bool:
    import jax

    try:
        return len(jax.devices(name)) > 0
    except RuntimeError:
        return False


def pytest_runtest_setup(item) -> None:
    for name in BACKEND_MARKERS:
        if item.get_closest_marker(name) is not None and not _has_backend(name):
            pytest.skip(f"no jax {name} backend on this machine")


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise pytest.UsageError(f"--stress-seeds must be comma-separated integers, got {text!r}") from None


@pytest.fixture
def harness_stress(request, tmp_path):
    """Run a stress matrix; fail with the table when any step is non-finite. Returns the table."""
    from xla_harness.stress import report
    from xla_harness.stress.runner import StressSpec, run_matrix

    steps = request.config.getoption("--stress-steps")
    seeds = _seeds(request.config.getoption("--stress-seeds"))

    program = request.config.getoption("--stress-program")

    def run(**overrides):
        if "program_options" in overrides:
            overrides["program_options"] = tuple(sorted(dict(overrides["program_options"]).items()))
        defaults = {"steps": steps, "seeds": seeds, **({"program": program} if program else {})}
        spec = StressSpec(**{**defaults, **overrides})
        out = tmp_path / f"stress{len(list(tmp_path.iterdir()))}"
        run_matrix(spec, out)
        table = report.load_table([out])
        if table.total_nonfinite:
            pytest.fail(f"{table.total_nonfinite} non-finite step(s):\n{report.format_table(table)}",
                        pytrace=False)
        return table

    return run
