"""The first code the CLI runs (imported by xla_harness/__init__.py before anything else): started as
the command (``xla-harness ...``, ``python -m xla_harness[.cli] ...``), SIGINT and SIGTERM are noted
from here on, and :mod:`xla_harness.runtime.interrupts` (which records into :data:`received`) and the CLI take
over from the note (exit 130/143, no traceback). Imported any other way it touches no signal.

A CLI process whose parent asked for it (:data:`DIE_WITH_PARENT` in its environment, set by
``xla_harness.runtime.subproc.start(..., die_with_parent=True)``) is killed when that parent dies
(:func:`die_with_parent`). Set here, in the child itself, rather than by a ``preexec_fn``: a
``preexec_fn`` runs Python in the forked child and makes the parent run fork's Python hooks
(``os.register_at_fork``: logging's ``_afterFork``), where an interrupt's handler raises into code
whose exceptions CPython only prints ("Exception ignored in: ...")."""

from __future__ import annotations

import os
import sys

DIE_WITH_PARENT = "XLA_HARNESS_DIE_WITH_PARENT"  # the parent's pid: the child dies with it (PR_SET_PDEATHSIG)
received: list[int] = []  # signal numbers, in order of arrival: xla_harness.runtime.interrupts' record
CLI_MODULES = ("xla_harness", "xla_harness.cli", "xla_harness.__main__")


def started_as_cli(argv: list[str]) -> bool:
    """Whether ``argv`` (``sys.orig_argv``) starts the CLI: ``python .../xla-harness ...`` or
    ``python [-X opt] -m xla_harness[.cli|.__main__] ...``."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return i + 1 < len(argv) and argv[i + 1] in CLI_MODULES
        if arg in ("-X", "-W"):
            i += 2
            continue
        if arg == "-c" or not arg.startswith("-"):
            return arg.rsplit("/", 1)[-1] == "xla-harness"
        i += 1
    return False



def die_with_parent() -> None:
    """If :data:`DIE_WITH_PARENT` names this process's parent, have Linux SIGKILL this process when the
    parent dies (``PR_SET_PDEATHSIG``); a parent already gone (it died before this ran) means SIGKILL now.
    The variable is taken out of the environment: this process's own children are not asked."""
    parent = os.environ.pop(DIE_WITH_PARENT, None)
    if parent is None or not parent.isdigit():
        return
    import signal

    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) != 0:  # PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError, ImportError):  # not Linux: no such call
        return
    if os.getppid() != int(parent):  # reparented: the parent died before the call above
        os.kill(os.getpid(), signal.SIGKILL)


cli_process = started_as_cli(list(getattr(sys, "orig_argv", ())))

if cli_process:
    import signal

    def _note(signum, frame):
        received.append(signum)

    for _s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(_s) is not signal.SIG_IGN:  # ignored by whoever started us: stays ignored
            signal.signal(_s, _note)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    die_with_parent()
