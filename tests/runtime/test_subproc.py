"""#27 item 3: every subprocess wait has a timeout that kills the child's whole process group.

Planted: a child that starts a grandchild sleeping forever (one variant whose grandchild ignores
SIGTERM, so only the SIGKILL after the grace ends it), waited on with a tiny timeout; an interrupt
arriving while the harness waits; a call of ``subprocess`` outside ``xla_harness.runtime.subproc`` written
into a copy of the scanned tree.
"""

from __future__ import annotations

import ast
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc

from ..helpers import grandchild_pid, planted_child, process_gone

ROOT = Path(__file__).resolve().parents[2]


SCANNED = ("xla_harness", "build", "tools")


@pytest.mark.slow
@pytest.mark.parametrize("ignore_term", [False, True], ids=["plain", "grandchild-ignores-sigterm"])
def test_a_timeout_kills_the_child_and_its_grandchild(tmp_path, ignore_term):
    pidfile = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    with pytest.raises(subproc.ChildTimeout) as caught:
        subproc.run(planted_child(pidfile, ignore_term), timeout=1.0, grace=0.5, capture_output=True, text=True)
    message = str(caught.value)
    assert isinstance(caught.value, HarnessError) and "\n" not in message
    assert message.startswith("sh -c ") and "did not finish in 1 s (its process group was killed)" in message
    assert time.monotonic() - t0 < 20  # not the grandchild's 1000 s (it holds the captured pipes too)
    assert process_gone(grandchild_pid(pidfile)), "the grandchild survived the timeout"


@pytest.mark.slow
def test_an_interrupt_while_waiting_kills_the_group_and_goes_on(tmp_path):
    """A child in its own session does not get the terminal's Ctrl-C: the harness kills its group."""
    pidfile = tmp_path / "grandchild.pid"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.5)
        with pytest.raises(KeyboardInterrupt):
            subproc.run(planted_child(pidfile, False), timeout=600, grace=0.5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert process_gone(grandchild_pid(pidfile)), "the grandchild survived the interrupt"


@pytest.mark.slow
def test_a_child_that_finishes_is_returned_as_subprocess_run_would():
    res = subproc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=60, capture_output=True, text=True)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")
    with pytest.raises(subprocess.CalledProcessError):
        subproc.run(["sh", "-c", "exit 1"], timeout=60, check=True)
    assert subproc.run(["cat"], timeout=60, input="in", capture_output=True, text=True).stdout == "in"


# ----------------------------------------------------------------------------- no wait left unbounded

SPAWNS = {("subprocess", n) for n in ("run", "Popen", "call", "check_call", "check_output", "getoutput",
                                        "getstatusoutput")} | {("os", n) for n in ("system", "popen")}


def direct_spawns(root: Path) -> list[str]:
    """``path:line`` of every call of a ``subprocess``/``os`` spawning function under ``root``'s
    scanned folders outside ``xla_harness/runtime/subproc.py`` (the one place children start)."""
    found = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "xla_harness/runtime/subproc.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name)
                        and (node.func.value.id, node.func.attr) in SPAWNS):
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_every_child_starts_through_subproc():
    assert direct_spawns(ROOT) == []


def test_the_scan_finds_a_planted_direct_spawn(tmp_path):
    for top in SCANNED:
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__", "_data"))
    victim = tmp_path / "xla_harness" / "upstream" / "apply.py"
    victim.write_text(victim.read_text() + "\n\ndef planted():\n    return subprocess.run(['git', 'status'])\n")
    (tmp_path / "tools" / "planted.py").write_text("import os\nos.system('sleep 1000')\n")
    lines = len(victim.read_text().splitlines())
    assert direct_spawns(tmp_path) == [f"xla_harness/upstream/apply.py:{lines}", "tools/planted.py:2"]
