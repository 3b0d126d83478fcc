"""JSONL result store: one line per finished step-block, appended with flush + fsync.

A results folder holds ``stress.jsonl`` (``stress.p<i>.jsonl`` for process i of a
multi-process run); records.py says what a line holds, jsonl.py how a line is written and read
(the lock, a whole fsynced append, a torn tail). One writer at a time: a run or a ``--resume``
takes the exclusive lock of ``<file>.lock`` before it reads anything, and a second one is
refused. ``--resume`` checks the header and the options before touching the file; a last line
cut short by ``kill -9`` is then cut (with a warning) and its steps are simply run again; a
valid last line lacking its newline is completed. Readers validate every line and name
``FILE:LINE`` of the first bad one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime.files import read_regular
from xla_harness.stress.results import jsonl, records
from xla_harness.stress.results.provenance import JAX_CONFIG_KEY, now, settings_difference, with_jax_settings
from xla_harness.stress.results.record_text import dumps


@dataclass
class Results:
    """A results file read and validated: its header, its blocks (and the line of each) and the
    origins of its failing steps (``stress --explain``)."""

    path: Path
    header: records.Header
    blocks: list[records.Block] = field(default_factory=list)
    origins: list[records.StepOrigin] = field(default_factory=list)
    block_lines: list[int] = field(default_factory=list)  # the line number of each block (1: the header)
    origin_lines: list[int] = field(default_factory=list)  # the line number of each origin


def _parse(path: Path, lineno: int, raw: bytes) -> records.Record:
    try:
        return records.parse_line(raw)
    except records.RecordError as exc:
        raise HarnessError(f"{path}:{lineno}: {exc}") from None


def _header(path: Path, first: bytes | None) -> records.Header:
    if first is None:
        raise HarnessError(f"{path} is empty; it is not a stress results file")
    try:
        rec = records.parse_line(first)
    except records.RecordError as exc:
        raise HarnessError(f"{path}:1: not a stress results header ({exc})") from None
    if not isinstance(rec, records.Header):
        raise HarnessError(f"{path}:1: not a stress results header (a block comes first)")
    return rec


@dataclass
class _Body:
    """The lines after a header, parsed: blocks with their line numbers, and origins."""

    blocks: list[records.Block] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    origins: list[records.StepOrigin] = field(default_factory=list)
    origin_lines: list[int] = field(default_factory=list)

    def add(self, rec: records.Record, lineno: int) -> None:
        if isinstance(rec, records.StepOrigin):
            self.origins.append(rec)
            self.origin_lines.append(lineno)
        elif isinstance(rec, records.Block):
            self.blocks.append(rec)
            self.lines.append(lineno)


def _body(path: Path, lines: list[bytes], first_lineno: int) -> _Body:
    body = _Body()
    for lineno, raw in enumerate(lines, first_lineno):
        rec = _parse(path, lineno, raw)
        if isinstance(rec, records.Header):
            raise HarnessError(f"{path}:{lineno}: a second header line")
        body.add(rec, lineno)
    return body


def _check_in_spec(path: Path, body: _Body, spec: dict) -> None:
    """Every block and origin of a file agrees with its header's spec (its program, its labels, seeds
    and steps), or HarnessError naming FILE:LINE: a run is never continued into a file that holds
    another run's lines."""
    for lineno, block in zip(body.lines, body.blocks, strict=True):
        try:
            records.check_block_in_spec(block, spec)
        except records.RecordError as exc:
            raise HarnessError(f"{path}:{lineno}: {exc}; it cannot be continued (choose another --out)") from None
    for lineno, origin in zip(body.origin_lines, body.origins, strict=True):
        try:
            records.check_origin_in_spec(origin, spec)
        except records.RecordError as exc:
            raise HarnessError(f"{path}:{lineno}: {exc}; it cannot be continued (choose another --out)") from None


def read_results(path: Path) -> Results:
    """Read and validate every line of a results file (report, merge, compare).

    A last line that lacks its newline and does not parse is a write in progress (a live
    run) and is left out; any other line that breaks the schema is an error naming FILE:LINE.
    """
    path = Path(path)
    lines, tail = jsonl.split_lines(read_regular(path))
    if tail is not None:
        try:
            records.parse_line(tail)
            lines.append(tail)
        except records.RecordError:
            pass
    header = _header(path, lines[0] if lines else None)
    body = _body(path, lines[1:], 2)
    return Results(path, header, body.blocks, body.origins, body.lines, body.origin_lines)


def spec_difference(old: dict, new: dict) -> str | None:
    """The first option in which two specs differ, as 'key=old, now new', or None."""
    unused = set() if old.get("reference") or new.get("reference") else {"reference_every"}
    settings = settings_difference(old.get(JAX_CONFIG_KEY), new.get(JAX_CONFIG_KEY))
    if settings:
        return settings
    for k in sorted(set(old) | set(new)):
        if k not in records.RESUMABLE_KEYS and k not in unused and old.get(k) != new.get(k):
            return f"{k}={old.get(k)!r}, now {new.get(k)!r}"
    return None


_OPEN_WRITERS: weakref.WeakSet[RunWriter] = weakref.WeakSet()


class RunWriter:
    """The one writer of a results file: holds its lock; every append is flushed and fsynced, whole
    (a line is written under ``self.writing``, which :func:`settle_open_writers` takes before a
    process ends itself from another thread)."""

    def __init__(self, path: Path, lock_fh, header: records.Header | None, blocks: list[records.Block],
                 origins: list[records.StepOrigin] | None = None):
        self.path = path
        self.header = header
        self.blocks = blocks
        self.origins = origins or []  # the origins the file held when opened (--resume)
        self._lock = lock_fh
        self._fh = None
        self.writing = threading.Lock()
        self.lines_written = 0  # counted for the cost figures (bench/stress_overhead.py)
        self.fsyncs = 0
        _OPEN_WRITERS.add(self)
        try:
            self._fh = jsonl.open_append(path)  # held for the run, closed by close()
        except HarnessError:
            self.close()
            raise

    def new_header(self, spec: dict, env: dict) -> records.Header:
        """The header of a run of ``spec``, with this process's jax settings added to it
        (:func:`with_jax_settings`: they are part of what a step computes), taken as this file's
        header; the caller appends it before any other line (or calls :meth:`write_header`)."""
        spec = with_jax_settings(spec)
        self.header = records.Header(spec=spec, fingerprint=records.spec_fingerprint(spec), env=env, time=now())
        return self.header

    def write_header(self, spec: dict, env: dict) -> records.Header:
        """Write the header of a run of ``spec`` now (:meth:`new_header`)."""
        header = self.new_header(spec, env)
        self.append(header)
        return header

    def append(self, record: records.Record | dict) -> None:
        try:
            line = dumps(record)
        except records.RecordError as exc:
            raise HarnessError(f"internal: refusing to write an invalid results record ({exc})") from None
        with self.writing:
            fh = self._fh
            if fh is None:
                raise HarnessError(f"internal: a record appended to {self.path} after its writer was closed")
            jsonl.write_line(fh.fileno(), line.encode(), self.path)
            self.lines_written += 1
            self.fsyncs += 1

    def settle(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for a line being written to be complete and on disk, then keep
        the file from taking another: for a process about to end without unwinding (``os._exit``).
        Returns False when a write was still under way after ``timeout``."""
        if not self.writing.acquire(timeout=timeout):
            return False
        fh = self._fh
        if fh is not None:
            with contextlib.suppress(OSError, ValueError):
                jsonl.sync(fh)
        return True  # the lock stays taken: nothing is written after this

    def close(self) -> None:
        for fh in (self._fh, self._lock):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()  # closing the lock file releases the lock
        self._fh = self._lock = None
        _OPEN_WRITERS.discard(self)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def settle_open_writers(timeout: float = 5.0) -> list[Path]:
    """:meth:`RunWriter.settle` every open writer of this process (each within ``timeout`` s); returns
    the files whose last write did not complete in time (their last line may be cut: ``--resume``
    cuts it and runs its steps again)."""
    return [w.path for w in list(_OPEN_WRITERS) if not w.settle(timeout)]


def _repair_tail(path: Path, data: bytes, tail: bytes, lineno: int) -> records.Block | records.StepOrigin | None:
    """Complete a valid last record lacking its newline (returned), or cut a tail that does not parse."""
    try:
        rec = records.parse_line(tail)
    except records.RecordError:
        rec = None
    if isinstance(rec, records.Header):
        raise HarnessError(f"{path}:{lineno}: a second header line")
    if rec is None:
        jsonl.cut_tail(path, data, tail)
        sys.stderr.write(f"warning: {path}:{lineno}: removed a truncated last line (an interrupted write); "
                         "its steps will be run again\n")
    else:
        jsonl.end_line(path)
    return rec


def open_run(path: Path, spec: dict, resume: bool) -> RunWriter:
    """Open a results file for a run of ``spec``: lock it, check it, repair its tail, return its writer.

    Order matters: the lock is taken first, then the header is checked (a file whose first
    line is not our header is never touched) and the options compared (with this process's jax
    settings: a run made under other settings, or one whose header predates them, is not
    continued), then every complete line is validated, and only then is a torn last line cut (or a
    valid one completed).
    """
    path = Path(path)
    spec = with_jax_settings(spec)
    check_writable(path.parent)
    if path.exists() and not path.is_file():
        raise HarnessError(f"{path} is not a regular file")
    lock = jsonl.take_lock(path)
    try:
        data = read_regular(path) if path.exists() else b""
        if not data:
            return RunWriter(path, lock, None, [])
        if not resume:
            raise HarnessError(f"{path} already holds results; pass --resume to continue them or choose another --out")
        lines, tail = jsonl.split_lines(data)
        header = _header(path, lines[0] if lines else tail)
        diff = spec_difference(header.spec, spec)
        if diff:
            raise HarnessError(f"{path} was written by a different run ({diff}); use a new --out or the same options")
        body = _body(path, lines[1:], 2)
        _check_in_spec(path, body, header.spec)  # every line agrees with the header before a byte is written
        if tail is not None and lines:
            last = _repair_tail(path, data, tail, len(lines) + 1)
            if last is not None:
                body.add(last, len(lines) + 1)
        elif tail is not None:  # the header itself lacks its newline
            jsonl.end_line(path)
        return RunWriter(path, lock, header, body.blocks, body.origins)
    except BaseException:
        lock.close()
        raise


def results_files(folder: Path) -> list[Path]:
    """The stress results files in a folder (one per process)."""
    folder = Path(folder)
    return sorted(p for p in folder.glob("stress*.jsonl") if p.is_file())


def check_writable(folder: Path) -> None:
    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise HarnessError(f"output folder {folder} is a link to {os.readlink(folder)}, which does not exist; "
                           "create its target or choose another --out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise HarnessError(f"output folder {folder} exists and is not a folder") from None
    except OSError as exc:
        raise HarnessError(f"cannot create output folder {folder}: {exc.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HarnessError(f"output folder {folder} is not writable")
