"""The first code the CLI runs (imported by xla_harness/__init__.py before anything else): started as
the command (``xla-harness ...``, ``python -m xla_harness[.cli] ...``), SIGINT and SIGTERM are noted
from here on, and :mod:`xla_harness.interrupts` (which records into :data:`received`) and the CLI take
over from the note (exit 130/143, no traceback). Imported any other way it touches no signal."""

from __future__ import annotations

import sys

received: list[int] = []  # signal numbers, in order of arrival: xla_harness.interrupts' record
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


cli_process = started_as_cli(list(getattr(sys, "orig_argv", ())))

if cli_process:
    import signal

    def _note(signum, frame):
        received.append(signum)

    for _s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(_s) is not signal.SIG_IGN:  # ignored by whoever started us: stays ignored
            signal.signal(_s, _note)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
