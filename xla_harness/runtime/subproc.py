"""Child processes that cannot hang the harness: every wait has a timeout, and what a timeout kills
is the child's whole process group, grandchildren included.

:func:`run` is ``subprocess.run`` for the package: the child starts in its own session (so its
process group is its own and holds everything it spawns), the wait is bounded, and on timeout, or
on any exception while waiting (an interrupt, a ``SystemExit`` from a signal handler), the group
gets SIGTERM, a short grace, then SIGKILL (:func:`kill_group`). A timeout is one
:class:`ChildTimeout` (a :class:`HarnessError`) naming the command and the limit.

A child in its own session no longer receives the terminal's Ctrl-C; the harness passes it on by
killing the group when the interrupt reaches it.

No child is started with a ``preexec_fn`` (:func:`start` refuses one): with it, CPython runs Python
between fork and exec, in the child and in fork's hooks in the parent (``os.register_at_fork``), and
an interrupt arriving then raises where CPython only prints it ("Exception ignored in: <function
_afterFork>"). Without it the child is started with no Python code run around the fork; what a
``preexec_fn`` would do is done by the child itself (``die_with_parent``: xla_harness/_early.py).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from xla_harness import _early
from xla_harness.errors import HarnessError

GRACE_S = 5.0  # between SIGTERM and SIGKILL of a timed-out group
SHOWN_CHARS = 200  # of a command line in an error message


class ChildTimeout(HarnessError):
    """A child (and its process group) was killed because it did not finish in time."""


def shown(argv: Any) -> str:
    """A command line (a string, a path or an argv sequence) as one short line for a message."""
    if isinstance(argv, bytes):
        argv = argv.decode(errors="backslashreplace")
    text = argv if isinstance(argv, str) else shlex.join(str(a) for a in argv) if isinstance(argv, Sequence) \
        else str(argv)
    text = " ".join(text.split())
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _leader_exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether the child exited within ``timeout`` s, without reaping it: while it is an unreaped
    zombie its pid (the group's id) cannot be given to another process, so a later killpg is safe."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.returncode is not None:
            return True
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        except AttributeError:  # no waitid (not Linux): wait for the leader, reaping it
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                return True
            except subprocess.TimeoutExpired:
                return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group of a child started by :func:`start` (none if it is reaped)."""
    if proc.returncode is None:
        _signal_group(proc.pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_group(proc: subprocess.Popen, grace: float = GRACE_S) -> None:
    """End a child started with ``start_new_session=True`` and everything in its process group:
    SIGTERM to the group, up to ``grace`` s for the child to exit, SIGKILL to the group (what
    ignored SIGTERM, or a grandchild left behind), then reap the child and drain its pipes."""
    try:
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            if grace > 0:
                _leader_exited(proc, grace)
    finally:  # the group outlives its leader while a grandchild is in it: always SIGKILL it
        _signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=grace or 1.0)
        except subprocess.TimeoutExpired:  # a pipe held open by a process that left the group
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            proc.wait()


def start(argv: str | Sequence[Any], die_with_parent: bool = False, **popen_kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` in a new session (its own process group), for :func:`wait`. With
    ``die_with_parent`` a child that is an ``xla-harness`` command is killed when this process dies
    (it sets that up itself, from its environment: xla_harness/_early.py)."""
    if popen_kwargs.get("preexec_fn") is not None:
        raise TypeError("subproc.start takes no preexec_fn: Python run around the fork turns an interrupt "
                        "into 'Exception ignored' (see the module docstring)")
    if die_with_parent:
        env = popen_kwargs.get("env")
        popen_kwargs["env"] = {**(os.environ if env is None else env), _early.DIE_WITH_PARENT: str(os.getpid())}
    return subprocess.Popen(argv, start_new_session=True, **popen_kwargs)


def wait(proc: subprocess.Popen, timeout: float, what: str | None = None, input: Any = None,
         grace: float = GRACE_S) -> tuple[Any, Any]:
    """``proc.communicate(input)`` within ``timeout`` s; on timeout the group is killed and
    :class:`ChildTimeout` names the command, on any other exception it is killed and the
    exception goes on."""
    try:
        return proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc, grace)
        raise ChildTimeout(f"{what or shown(proc.args)} did not finish in {timeout:g} s "
                           "(its process group was killed)") from None
    except BaseException:
        kill_group(proc, grace)
        raise


def run(argv: str | Sequence[Any], *, timeout: float, what: str | None = None, input: Any = None,
        capture_output: bool = False, check: bool = False, grace: float = GRACE_S, die_with_parent: bool = False,
        **popen_kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a new session with a bounded wait (see the module docstring).
    ``what`` names the command in the timeout's message (default: the command line)."""
    if capture_output:
        popen_kwargs["stdout"] = popen_kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    proc = start(argv, die_with_parent, **popen_kwargs)
    stdout, stderr = wait(proc, timeout, what, input, grace)
    assert proc.returncode is not None
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv, stdout, stderr)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
