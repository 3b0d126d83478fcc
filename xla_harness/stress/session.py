"""What a stress run needs around the loop, for every command that runs one (``stress``, ``triage``,
the pytest plugin): the interrupt handling that lets a step finish and the watchdog that ends a
stuck one (:class:`StopFlag`), the progress drawn from the runner's events (:class:`Progress`), the
host platform split into devices, and ``jax.distributed`` start-up. None of it decides what is
measured; the runner takes the stop flag and the progress as collaborators."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from xla_harness import interrupts
from xla_harness.errors import HarnessError

STOP_GRACE_S = 60.0  # after SIGINT/SIGTERM, how long the current step may take before the run ends anyway


def terminal_columns(stream) -> int:
    """Columns of the terminal ``stream`` writes to: $COLUMNS when set, else the stream's own
    terminal, else shutil.get_terminal_size's answer (stdout's terminal, or 80)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cols = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        cols = 0
    return cols if cols > 0 else shutil.get_terminal_size().columns


class Progress:
    """Draws the runner's events on stderr and keeps the step fingerprint of every configuration.

    ``mode``: "auto" (the default) rewrites one status line in place when stderr is a terminal,
    never wider than it, and prints nothing otherwise; "lines" (--progress) prints plain lines
    for logs, one per finished configuration and one about every LOG_EVERY_S seconds while one runs;
    "off" (--quiet) prints nothing."""

    LOG_EVERY_S = 30.0

    def __init__(self, mode: str = "auto"):
        self.tty = sys.stderr.isatty()
        self.mode = "live" if mode == "auto" and self.tty else "lines" if mode == "lines" else "off"
        self.enabled = self.mode != "off"
        self.t0 = self.last_line = time.perf_counter()
        self.first_done: int | None = None
        self.fingerprints: dict[str, dict] = {}
        self._open = False  # a live line is on screen without its newline

    def __call__(self, e) -> None:
        if e.kind == "compiled":
            self.fingerprints[e.label] = e.fingerprint
            return
        if self.first_done is None:
            self.first_done = e.done_steps - (e.block.end - e.block.start)
        if not self.enabled:
            return
        now = time.perf_counter()
        rate = (e.done_steps - self.first_done) / max(now - self.t0, 1e-9)
        width = 24
        filled = int(width * e.done_steps / max(e.total_steps, 1))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {e.done_steps}/{e.total_steps} steps "
                f"{e.label} seed {e.seed} step {e.block.end} non-finite {e.nonfinite} | {rate:.1f} steps/s")
        if self.mode == "live":
            cols = max(terminal_columns(sys.stderr) - 1, 1)  # the last column would wrap on some terminals
            sys.stderr.write("\r" + line[:cols].ljust(cols))
            self._open = e.done_steps < e.total_steps
            if not self._open:
                sys.stderr.write("\n")
        elif e.config_done or e.done_steps >= e.total_steps or now - self.last_line >= self.LOG_EVERY_S:
            sys.stderr.write(line + "\n")
            self.last_line = now
        sys.stderr.flush()

    def close(self) -> None:
        if self._open:
            sys.stderr.write("\n")
            self._open = False


def ensure_host_devices(n: int) -> None:
    """Split the CPU into ``n`` devices; must run before jax is imported."""
    if n <= 1:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    if "jax" in sys.modules:
        return  # too late to change; build_program reports a clear error if devices are missing
    os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()


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
        from xla_harness.stress.store import settle_open_writers

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


def wait_for_coordinator(address: str, timeout: float) -> None:
    """Poll HOST:PORT until it accepts a TCP connection. jax's client aborts the whole process
    when the coordinator is unreachable, so non-zero processes check first and fail cleanly."""
    import socket
    import time

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise HarnessError(f"--coordinator must be HOST:PORT, got {address!r}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise HarnessError(f"coordinator {address} did not come up within {timeout:g} s; start "
                                   "process 0 first, or check the address") from None
            time.sleep(0.5)  # polling a socket, not timing anything


def init_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None,
                     from_environment: bool, init_timeout: float) -> int:
    """jax.distributed.initialize from the flags (``--coordinator``, ``--num-processes``, ``--process-id``)
    or from the environment (``--distributed``); returns the process count."""
    explicit = coordinator or num_processes or process_id is not None
    if not (explicit or from_environment):
        return 1
    if explicit and not (coordinator and num_processes and process_id is not None):
        raise HarnessError("--coordinator, --num-processes and --process-id go together")
    if explicit and not 0 <= int(process_id or 0) < int(num_processes or 0):
        raise HarnessError(f"--process-id must be in [0, {num_processes})")
    import jax

    with contextlib.suppress(AttributeError, ValueError):  # CPU collectives across processes (not TPU/GPU)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs: dict[str, Any] = {"initialization_timeout": init_timeout}
    if explicit and process_id != 0:
        wait_for_coordinator(str(coordinator), init_timeout)
    if explicit:
        kwargs.update(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as exc:  # jax raises several types here; all mean "not connected"
        where = coordinator or "the coordinator from the environment"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"jax.distributed could not connect to {where} within {init_timeout} s "
                           f"({first[:160]})") from None
    return jax.process_count()
