"""SIGINT/SIGTERM arriving while triage starts a stage's child: the harness runs no Python around the fork
(no ``preexec_fn``, so no ``os.register_at_fork`` hook runs), so an interrupt is never raised inside
fork's hooks, where CPython only prints it ("Exception ignored in: <function _afterFork> ...
Interrupted"). What the ``preexec_fn`` did (the child dies with its parent) the child does itself
(xla_harness/_early.py), from its environment.

Planted: a fork hook that sends SIGINT at every fork that runs Python's hooks (the old way, a
``preexec_fn``, runs them each time), plus a thread sending SIGINT at random moments, while
``Triage._child`` starts child after child; a parent killed with SIGKILL under a child that asked to
die with it; a child whose parent was gone before it asked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from xla_harness import _early
from xla_harness.runtime import subproc

from ..helpers import process_gone

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# Starts SPAWNS triage stage children (``xla-harness --version``) the way a triage does, under the
# handlers that raise Interrupted, while SIGINT arrives: at each fork that runs Python's fork hooks
# (deterministic: libc's kill as the hook, which checks no signal itself, so the handler runs in the
# next Python code: logging's _prepareFork/_afterFork, as in the report) and from a thread at random
# moments. Each Interrupted is caught and counted.
STORM = textwrap.dedent("""
    import ctypes, functools, logging, os, random, signal, sys, threading
    from pathlib import Path
    from xla_harness.runtime import interrupts
    from xla_harness.triage.run import Triage
    from xla_harness.triage.spec import TriageSpec

    out, spawns = Path(sys.argv[1]), int(sys.argv[2])
    os.register_at_fork(before=functools.partial(ctypes.CDLL(None).kill, os.getpid(), signal.SIGINT))
    triage = Triage(TriageSpec(program="m.py:make", options=[], targets=[], hlo=[]), out)
    stage = triage.stages[0]
    done = threading.Event()

    def storm():
        while not done.wait(random.uniform(0.0, 0.2)):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=storm, daemon=True).start()
    finished = caught = 0
    with interrupts.raising_on_signal():
        for i in range(spawns):
            try:
                triage._child(stage, f"c{i}", ["--version"], timeout=60)
                finished += 1
            except interrupts.Interrupted:
                caught += 1
                interrupts.forget()
        done.set()
    print(finished, caught)
""")


@pytest.mark.slow
def test_interrupts_while_triage_forks_its_children_are_never_printed_as_ignored(tmp_path):
    spawns = 30
    res = subprocess.run([sys.executable, "-c", STORM, str(tmp_path / "t"), str(spawns)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    finished, caught = map(int, res.stdout.split())
    assert finished + caught == spawns and caught >= 1, res.stdout  # the signals did arrive while spawning
    assert "Exception ignored" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    for path in (tmp_path / "t" / "stages").rglob("*.stderr.txt"):  # nor in a child's, killed while starting
        text = path.read_text(errors="replace")
        assert "Exception ignored" not in text and "Traceback" not in text, (path.name, text)


def test_subproc_refuses_a_preexec_fn():
    with pytest.raises(TypeError, match="preexec_fn"):
        subproc.start(["true"], preexec_fn=lambda: None)


# A child that asks to die with its parent (as a triage stage's child does on starting), then writes
# its pid and sleeps.
ASKS = "import os, sys, time; from xla_harness import _early; _early.die_with_parent(); " \
       "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
# A parent that starts it through subproc (die_with_parent=True) and sleeps.
PARENT = "import sys; from xla_harness.runtime import subproc; " \
         f"subproc.start([sys.executable, '-c', {ASKS!r}, sys.argv[1]], die_with_parent=True); " \
         "import time; time.sleep(120)"


@pytest.mark.slow
def test_a_child_started_to_die_with_its_parent_dies_with_it(tmp_path):
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pidfile)], env=ENV, start_new_session=True)
    child = 0
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()):
            assert parent.poll() is None and time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)  # polling a file, not timing anything
        child = int(pidfile.read_text())
        assert not process_gone(child, limit=0.5)
        parent.kill()
        parent.wait()
        assert process_gone(child), "the child outlived its parent's SIGKILL"
    finally:
        parent.kill()
        parent.wait()
        if child:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child, signal.SIGKILL)


@pytest.mark.slow
def test_a_harness_child_whose_parent_is_already_gone_ends_itself():
    """The parent died before the child asked: the child (an ``xla-harness`` command, as a triage stage's
    is) is killed at once; asked by no one, it runs."""
    gone = {**ENV, _early.DIE_WITH_PARENT: "1"}  # not this child's parent: it was reparented
    res = subprocess.run([sys.executable, "-m", "xla_harness", "--version"], env=gone, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == -signal.SIGKILL, res
    res = subprocess.run([sys.executable, "-m", "xla_harness", "--version"], env=ENV, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("xla-harness"), res
