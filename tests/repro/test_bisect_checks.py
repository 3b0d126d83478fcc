"""#34 item 9: the children the CLI starts keep the CLI's promises.

bisect-passes --target with libtpu missing, a bad --program-option or a missing program printed only
"listing passes failed: compiler exited 1": what it can check itself is checked before a probe
starts, and a probe's own error line is passed on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- item 9


@pytest.mark.slow
def test_a_probe_s_own_error_line_is_passed_on(tmp_path):
    """What the child said, not only its exit status: here a stand-in interpreter that says it."""
    from xla_harness.repro.bisect import SubprocessOracle

    fake = tmp_path / "python"
    said = "--program p.py:make: building the program raised ValueError: planted"
    fake.write_text(f"#!/bin/sh\necho 'error: {said}' >&2\nexit 2\n")
    fake.chmod(0o755)
    with pytest.raises(HarnessError) as got:
        SubprocessOracle({"program": "p.py:make"}, python=str(fake)).passes()
    assert str(got.value) == f"listing passes failed: {said}"
    fake.write_text("#!/bin/sh\necho 'jaxlib.JaxRuntimeError: INTERNAL: pass failed' >&2\nexit 1\n")
    with pytest.raises(HarnessError, match="baseline run failed: jaxlib.JaxRuntimeError: INTERNAL: pass failed"):
        SubprocessOracle({"program": "p.py:make"}, python=str(fake)).baseline(2)


@pytest.mark.slow
def test_a_program_that_cannot_be_built_is_named_by_the_probe(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("def make(**options):\n    raise ValueError('planted: this program cannot be built')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "xla_harness", "bisect-passes", "--quiet", "--oracle", "hlo", "--out",
                           str(tmp_path / "b"), "--program", f"{prog}:make"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.count("error:") == 1
    assert "listing passes failed: --program" in done.stderr and "ValueError: planted" in done.stderr
    assert not (tmp_path / "b").exists()  # nothing logged for a bisection that never started


@pytest.mark.parametrize("argv,says", [
    (["--program", "{tmp}/nothere.py:make"], "no such file"),
    (["--program", "issue-35409", "--program-option", "jit=bogus"], "option jit must be"),
], ids=["missing-program", "bad-option"])
def test_bisect_checks_what_it_can_before_a_probe_starts(argv, says, tmp_path, monkeypatch, capsys):
    from xla_harness.cli import main
    from xla_harness.repro import bisect

    monkeypatch.setattr(bisect.SubprocessOracle, "_call", lambda self, extra: pytest.fail("a probe started"))
    assert main(["bisect-passes", "--quiet", "--oracle", "hlo", "--out", str(tmp_path / "b"),
                 *[a.replace("{tmp}", str(tmp_path)) for a in argv]]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_bisect_names_a_missing_target_compiler_before_a_probe_starts(tmp_path, monkeypatch, capsys):
    from xla_harness.cli import main
    from xla_harness.repro import bisect
    from xla_harness.targets import devices

    monkeypatch.setattr(bisect.SubprocessOracle, "_call", lambda self, extra: pytest.fail("a probe started"))
    monkeypatch.setattr(devices, "missing", lambda target: f"--target {target.text} needs libtpu: planted")
    assert main(["bisect-passes", "--quiet", "--oracle", "hlo", "--target", "tpu:v6e:2x4", "--out",
                 str(tmp_path / "b")]) == 2
    assert "needs libtpu" in capsys.readouterr().err
