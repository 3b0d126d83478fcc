"""How a triage stage's child process ended, in words: the last thing it said on stderr (its last
``error:`` line), how one that said nothing ended (its exit code or the signal that killed it), and
why a ``stress`` round recorded no step.
"""

from __future__ import annotations

import signal
from pathlib import Path

NO_OUTPUT = "(no output)"


def last_said(stderr: Path) -> str:
    """The last ``error:`` (or ``interrupted``) line of a child's ``stderr`` file, else its last line,
    else :data:`NO_OUTPUT`; at most 300 characters."""
    lines = [ln for ln in stderr.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()] \
        if stderr.is_file() else []
    errors = [ln for ln in lines if ln.startswith(("error:", "interrupted"))]
    return (errors or lines or [NO_OUTPUT])[-1][:300]


def ended(returncode: int) -> str:
    """How a child that said nothing on stderr ended, in words."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "a signal"
        return (f"its process was killed by {name} (signal {-returncode}) before it said anything: the program "
                "killed it, or the machine ran out of memory")
    return f"it ended with exit {returncode} and said nothing on stderr"


def no_step(returncode: int, seconds: float, said: str) -> str:
    """Why a stress round recorded no step, from how its process ended."""
    if returncode in (124, 143):
        return (f"its first step did not finish within {max(seconds, 30.0):.0f} s (a step that hangs: a "
                "collective, a host callback; the round was stopped)")
    if returncode == 0:
        return "the program ended its own process (exit 0) before its first step was recorded"
    return f"the round ended with exit {returncode}: {said}"
