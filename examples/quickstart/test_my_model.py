"""The README's pytest recipe: stress tests of examples/quickstart/my_model.py with the plugin's fixture.

Opt-in, so a plain ``pytest`` skips them; run from the repository root::

    pytest --xla-harness-stress examples/quickstart/test_my_model.py
    pytest --xla-harness-stress --runxfail examples/quickstart/test_my_model.py   # see the failure message
"""

import pytest

PROGRAM = "examples/quickstart/my_model.py:make"


def test_my_model_stays_finite(xla_harness_stress):
    xla_harness_stress(program=PROGRAM, program_options={"width": 32})


@pytest.mark.xfail(strict=True, reason="NaNs planted in 10% of the steps: the fixture must fail the test")
def test_planted_nans_fail_the_test(xla_harness_stress):
    xla_harness_stress(program=PROGRAM, inject_rate=0.1)
