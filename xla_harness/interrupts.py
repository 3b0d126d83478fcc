"""Which interrupt (SIGINT/SIGTERM) this process has received, so that what an interrupt breaks is
never reported as the user's error.

A signal sent to a process group reaches the compiler's children too: under ``timeout`` or Ctrl-C,
``ptxas`` dies of the SIGTERM and XLA raises ``INTERNAL: ptxas exited with non-zero error code 15``
from inside the program's ``init``. :func:`xla_harness.programs.interface.guard_user_error` asks
:func:`received` before blaming the program: once an interrupt has arrived, the error is the
interrupt's, and :class:`Interrupted` (exit 130/143) says where it arrived and what it broke.

The handlers that record a signal are the command's (``stress``'s stop flag records and lets the
step finish; :func:`raising_on_signal` records and raises at once, for compiles that keep nothing
half done). The record is process-wide, as signals are, and each of those handlers clears it when
it is installed and when it is taken down, so one run's signal is never another's.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_received: list[int] = []  # signal numbers, in order of arrival


class Interrupted(BaseException):
    """SIGINT/SIGTERM ended the run ``where`` it was; ``caused`` is the error the signal provoked (a
    compiler's child killed), if any. A BaseException, like KeyboardInterrupt: no ``except Exception``
    on its way up turns it into a compile or program error."""

    def __init__(self, signum: int, where: str = "", caused: str = "") -> None:
        super().__init__(signum, where, caused)
        self.signum = signum
        self.where = where
        self.caused = caused

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        text = f"interrupted by {name}" + (f" while {self.where}" if self.where else "")
        if self.caused:
            text += f" (what it then raised, {self.caused}, is the signal's doing, not an error of the program)"
        return text


def record(signum: int) -> None:
    """Note that ``signum`` arrived (called from a signal handler: no I/O, no locks)."""
    _received.append(signum)


def received() -> int | None:
    """The first interrupt this process received, or None."""
    return _received[0] if _received else None


def forget() -> None:
    """Clear the record (a test, or a library user running again in the same process)."""
    _received.clear()


@contextlib.contextmanager
def raising_on_signal() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (after the C call in progress
    returns), recorded first; the previous handlers are restored after."""

    def handle(signum, frame):
        record(signum)
        raise Interrupted(signum)

    forget()
    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        forget()  # the record belongs to this run; a later one in the process starts clean
