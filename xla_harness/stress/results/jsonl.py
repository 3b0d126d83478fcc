"""The file mechanics of every JSONL file the stress package writes and reads (``stress.jsonl``,
``compile.jsonl``): one writer at a time (an exclusive ``fcntl.flock`` on a ``.lock`` file beside the
file), a line appended whole and fsynced or not at all, a file's bytes split into its complete lines
and a torn tail, and a torn tail cut (or a whole last line completed), fsynced.

What a line holds, and what a torn tail means to a run, is the callers': records.py and
record_text.py (a results record and its line), store.py (the results file), compile_records.py
(compile records)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO

from xla_harness.errors import HarnessError


def lock_path(path: Path) -> Path:
    """The lock file of ``path``: ``<file>.lock`` beside it."""
    return path.with_name(path.name + ".lock")


def take_lock(path: Path) -> IO[str]:
    """Take the exclusive lock of a results file (a ``.lock`` file beside it) or refuse. The lock is
    held while the returned file is open: closing it releases the lock."""
    lp = lock_path(path)
    try:
        fh = open(lp, "a")  # noqa: SIM115 - the lock lives as long as the writer
    except OSError as exc:
        raise HarnessError(f"cannot create the lock file {lp}: {exc.strerror}") from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise HarnessError(f"another stress run is writing {path} (it holds {lp.name}); wait for it to "
                           "finish or choose another --out") from None
    return fh


def open_append(path: Path) -> IO[bytes]:
    """``path`` opened to append lines to (created if absent); HarnessError naming the file if it cannot be."""
    try:
        return open(path, "ab")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise HarnessError(f"cannot write results to {path}: {exc.strerror}") from None


def write_line(fd: int, line: bytes, path: Path) -> None:
    """Append ``line`` and its newline to the file open at ``fd`` and fsync it, whole or not at all: a
    write that fails part-way (a full disk) is cut back to where the line began, so the file never ends
    in half a line this process wrote, and the error names the file (``path``)."""
    data = line + b"\n"
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)  # shrinking needs no space
        raise HarnessError(f"cannot write results to {path}: {exc.strerror or exc}") from None


def append_line(path: Path, line: bytes) -> None:
    """Open ``path``, append ``line`` whole and fsynced (:func:`write_line`), close it."""
    with open_append(path) as fh:
        write_line(fh.fileno(), line, path)


def sync(fh: IO[bytes]) -> None:
    """Flush an open file and fsync it."""
    fh.flush()
    os.fsync(fh.fileno())


def split_lines(data: bytes) -> tuple[list[bytes], bytes | None]:
    """(complete lines, the last line if it lacks its newline)."""
    parts = data.split(b"\n")
    tail = parts.pop()
    return parts, (tail if tail else None)


def cut_tail(path: Path, data: bytes, tail: bytes) -> None:
    """Cut the torn last line ``tail`` off the file ``path`` whose bytes are ``data``, fsynced."""
    with open(path, "r+b") as fh:
        fh.truncate(len(data) - len(tail))
        sync(fh)


def end_line(path: Path) -> None:
    """Complete a last line that lacks its newline (append it), fsynced."""
    with open(path, "ab") as fh:
        fh.write(b"\n")
        sync(fh)
