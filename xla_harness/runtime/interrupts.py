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

from xla_harness import _early

# Signal numbers, in order of arrival: the list the CLI's first code notes into (xla_harness/_early.py),
# so a signal that arrived while the CLI was still starting is one this module has received.
_received: list[int] = _early.received


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

    def arrived_while(self, where: str) -> None:
        """Where the run was when it arrived (``where``), unless a deeper frame already said."""
        self.where = self.where or where

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


def _importing(frame) -> bool:
    """Whether the main thread is inside an import (a frame of importlib's bootstrap on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    """Send ``signum`` to the main thread again once it is out of the import it was in (polled), while
    the signal is still recorded and :func:`_raise` still handles it."""
    import sys
    import threading
    import time

    main = threading.main_thread().ident
    if main is None:
        return
    while received() is not None and signal.getsignal(signum) is _raise:
        frame = sys._current_frames().get(main)  # noqa: SLF001 - the one way to see another thread's stack
        if frame is None:
            return
        if not _importing(frame):
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(main, signum)
            return
        time.sleep(0.02)


def _raise(signum, frame):
    """Record ``signum`` and raise :class:`Interrupted`, except inside an import: raised there it breaks
    the module (a C extension's init turns it into an ImportError, prints it, or aborts the process), so
    it is raised again as soon as the import is over (:func:`_redeliver`, from a helper thread)."""
    first = received() is None
    record(signum)
    if _importing(frame):
        if first:
            import threading

            threading.Thread(target=_redeliver, args=(signum,), name="xla-harness-interrupt", daemon=True).start()
        return
    raise Interrupted(received() or signum)


_cli: list[bool] = []  # non-empty while the command line's handlers are installed (:func:`cli_handlers`)


def take_pending(where: str = "starting") -> None:
    """What a run's handlers do with a signal recorded before they were installed. Under the command
    line (:func:`cli_handlers`) it arrived in this same command, while it started, and was raised
    nowhere or swallowed on its way (an exception in a finalizer is only printed): raise
    :class:`Interrupted` now, so it is never lost. Anywhere else (the pytest plugin runs several runs in
    one process) it is an earlier run's, and is cleared."""
    signum = received()
    if signum is not None and _cli:
        raise Interrupted(signum, where)
    forget()


@contextlib.contextmanager
def raising_on_signal() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (after the C call in progress
    returns), recorded first; the previous handlers are restored after. A signal recorded before
    (:func:`take_pending`) raises at once."""
    take_pending()
    old = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        take_pending()  # one that came while the handlers were being installed
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        forget()  # the record belongs to this run; a later one in the process starts clean


def cli_handlers() -> dict | None:
    """The command line's handlers, from its first line of code to its last: SIGINT/SIGTERM are
    recorded and raise :class:`Interrupted` (exit 130/143, no traceback), including while jax and the
    compilers load; a disposition of SIG_IGN set by whoever started the process stays. Returns the
    handlers to put back (:func:`restore`); None off the main thread, where signals cannot be handled."""
    try:
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s, h in old.items():
            if h is not signal.SIG_IGN:
                signal.signal(s, _raise)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(old))
    except (ValueError, OSError):  # not the main thread
        return None
    _cli.append(True)
    return old


def restore(old: dict | None) -> None:
    """Put back the handlers :func:`cli_handlers` replaced; the command's record ends with it."""
    if old is not None:
        _cli.clear()
        for s, h in old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(s, h if h is not None else signal.SIG_DFL)
        forget()
