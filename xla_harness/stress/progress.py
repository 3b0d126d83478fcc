"""The progress of a stress run, drawn from the runner's events (:class:`Progress`): a bar on a
terminal, lines in a log, or nothing. It only observes: nothing it does decides what is measured."""

from __future__ import annotations

import os
import shutil
import sys
import time


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
