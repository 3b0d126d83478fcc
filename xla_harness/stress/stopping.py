"""Stopping a stress run cleanly, for every command that runs one (``stress``, ``triage``, the pytest
plugin): the interrupt handling that lets the current step finish and the watchdog that ends a stuck
one (:class:`StopFlag`). The runner takes the flag as a collaborator."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from xla_harness.runtime import interrupts

STOP_GRACE_S = 60.0  # after SIGINT/SIGTERM, how long the current step may take before the run ends anyway


class StopFlag:
    """SIGINT/SIGTERM: ask the loop to stop after the current step; a second signal stops at once.

    A Python signal handler runs only between bytecodes of the main thread, so a step stuck in
    compiled code (or an import that never returns) would never see it. The signal also reaches a
    watchdog thread through ``signal.set_wakeup_fd`` (written by the C-level handler): if the run
    has not wound down ``grace`` seconds after the first signal, or at a second signal, the watchdog
    waits for a results line being written to be whole and on disk, names the results file, and
    ends the process with 128 + the signal's number. Steps after the last written block are not
    lost: ``--resume`` runs them again.
    """

    def __init__(self, grace: float = STOP_GRACE_S, results: Callable[[], str] | None = None) -> None:
        self.signum: int | None = None
        self.grace = grace
        self.results = results or (lambda: "the results file")
        self._old: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._old_wakeup = -1
        self._socks: tuple[Any, Any] | None = None
        self._done = threading.Event()
        self._watchdog: threading.Thread | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # second signal: stop now
            self._end(signum, "a second signal")
        interrupts.record(signum)  # an error the signal provokes (a compiler's child killed) is its own
        self.signum = signum  # the watchdog says so on stderr: this handler may run only much later

    def _end(self, signum: int, why: str) -> None:
        """Settle the results files and end the process (from either thread): nothing after this."""
        from xla_harness.stress.results.store import settle_open_writers

        cut = settle_open_writers()
        message = (f"\n{signal.Signals(signum).name}: stopped at once ({why}); results so far are in "
                   f"{self.results()}; steps after its last line run again with --resume\n")
        if cut:
            message += f"the last line of {', '.join(map(str, cut))} may be cut; --resume repairs it\n"
        with contextlib.suppress(OSError):
            os.write(2, message.encode("utf-8", "backslashreplace"))
        os._exit(128 + signum)

    def _watch(self, rsock) -> None:
        first: float | None = None
        signum = signal.SIGTERM
        while not self._done.is_set():
            wait = 0.5 if first is None else max(0.0, min(0.5, first + self.grace - time.monotonic()))
            ready, _, _ = select.select([rsock], [], [], wait)
            if self._done.is_set():
                return
            if ready:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    for got in rsock.recv(64):
                        if got not in (signal.SIGINT, signal.SIGTERM):
                            continue
                        if first is not None:
                            self._end(got, "a second signal")
                        first, signum = time.monotonic(), got
                        with contextlib.suppress(OSError):
                            os.write(2, (f"\n{signal.Signals(got).name}: finishing the current step (at most "
                                         f"{self.grace:g} s more; a second signal stops at once), flushing "
                                         "results\n").encode())
            if first is not None and time.monotonic() >= first + self.grace:
                self._end(signum, f"the current step did not finish within {self.grace:g} s")

    def install(self) -> None:
        import socket

        # a signal of an earlier run in this process is not this run's; one of this command's own, recorded
        # before this (while it started), stops it here
        interrupts.take_pending("starting, before the first step")

        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        self._socks = (rsock, wsock)
        self._old_wakeup = signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        self._done.clear()
        self._watchdog = threading.Thread(target=self._watch, args=(rsock,), name="xla-harness-stop-watchdog",
                                          daemon=True)
        self._watchdog.start()

    def restore(self) -> None:
        self._done.set()
        interrupts.forget()
        if self._socks is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            if self._watchdog is not None:
                self._watchdog.join(timeout=5)
            for sock in self._socks:
                sock.close()
            self._socks = None
        for s, h in self._old.items():
            signal.signal(s, h)
