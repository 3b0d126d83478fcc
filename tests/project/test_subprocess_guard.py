"""The guard that keeps subprocess-spawning tests out of ``make test-fast`` fails when it should."""

import pytest

TEST_FILE = """
import subprocess, sys
import pytest

def test_unmarked_spawn():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.slow
def test_marked_spawn():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_no_spawn():
    assert True
"""


@pytest.mark.slow  # the planted tests start interpreters
def test_guard_fails_an_unmarked_subprocess_test_only(pytester):
    pytester.makepyfile(test_spawns=TEST_FILE)
    result = pytester.runpytest("-p", "tests.subprocess_guard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*test_unmarked_spawn starts a subprocess*not marked @pytest.mark.slow*"])
