"""The file mechanics of the stress package's JSONL files (xla_harness/stress/results/jsonl.py), each alone: the
lock beside a file, a line appended whole and fsynced (a write that fails part-way leaves no half
line), a file's bytes split into lines and a torn tail, a torn tail cut and a last line completed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.stress.results import jsonl

# ----------------------------------------------------------------------------- the lock


def test_the_lock_file_is_beside_the_file(tmp_path):
    assert jsonl.lock_path(tmp_path / "stress.jsonl") == tmp_path / "stress.jsonl.lock"
    assert jsonl.lock_path(tmp_path / "co" / "compile.jsonl") == tmp_path / "co" / "compile.jsonl.lock"


def test_a_second_lock_on_the_same_file_is_refused_until_the_first_is_closed(tmp_path):
    p = tmp_path / "stress.jsonl"
    first = jsonl.take_lock(p)
    try:
        assert (tmp_path / "stress.jsonl.lock").is_file() and not p.exists()  # only the lock file is made
        with pytest.raises(HarnessError) as exc:
            jsonl.take_lock(p)
        assert str(exc.value) == (f"another stress run is writing {p} (it holds stress.jsonl.lock); wait for it "
                                  "to finish or choose another --out")
        other = jsonl.take_lock(tmp_path / "compile.jsonl")  # another file's lock is its own
        other.close()
    finally:
        first.close()
    again = jsonl.take_lock(p)  # closing the lock file released the lock
    again.close()


def test_a_lock_file_that_cannot_be_made_is_one_clear_error(tmp_path):
    p = tmp_path / "missing" / "stress.jsonl"
    with pytest.raises(HarnessError, match=r"cannot create the lock file .*missing/stress\.jsonl\.lock: "
                                           "No such file or directory"):
        jsonl.take_lock(p)


# ----------------------------------------------------------------------------- a line appended whole


def _fail_on(fd: int, monkeypatch, name: str, fail):
    """``os.<name>`` failing as ``fail`` says for ``fd``, the real one for every other descriptor."""
    real = getattr(os, name)

    def fake(d, *args):
        return fail(real, d, *args) if d == fd else real(d, *args)

    monkeypatch.setattr(jsonl.os, name, fake)


def test_a_line_is_appended_with_its_newline_and_fsynced(tmp_path, monkeypatch):
    p = tmp_path / "stress.jsonl"
    p.write_bytes(b'{"a": 1}\n')
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(jsonl.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    with jsonl.open_append(p) as fh:
        jsonl.write_line(fh.fileno(), b'{"b": 2}', p)
        assert synced == [fh.fileno()]
        jsonl.write_line(fh.fileno(), b'{"c": 3}', p)
    jsonl.append_line(p, b'{"d": 4}')
    assert p.read_bytes() == b'{"a": 1}\n{"b": 2}\n{"c": 3}\n{"d": 4}\n'
    assert len(synced) == 3


def test_a_short_write_is_continued_until_the_line_is_whole(tmp_path, monkeypatch):
    p = tmp_path / "stress.jsonl"
    with jsonl.open_append(p) as fh:
        _fail_on(fh.fileno(), monkeypatch, "write", lambda real, d, view: real(d, view[:3]))  # 3 bytes a call
        jsonl.write_line(fh.fileno(), b'{"step": 12345}', p)
    assert p.read_bytes() == b'{"step": 12345}\n'


def test_a_write_that_fails_half_way_leaves_no_half_line(tmp_path, monkeypatch):
    """A full disk part-way through a line: the bytes written are cut back to where the line began and the
    error names the file; the file ends as it did before the line."""
    p = tmp_path / "stress.jsonl"
    p.write_bytes(b'{"a": 1}\n')
    calls = []

    def half_then_full(real, d, view):
        calls.append(len(view))
        if len(calls) == 1:
            return real(d, view[:len(view) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with jsonl.open_append(p) as fh:
        _fail_on(fh.fileno(), monkeypatch, "write", half_then_full)
        with pytest.raises(HarnessError) as exc:
            jsonl.write_line(fh.fileno(), b'{"b": 2, "padding": "' + b"x" * 100 + b'"}', p)
    assert str(exc.value) == f"cannot write results to {p}: No space left on device"
    assert len(calls) == 2  # the first half was written: the cut removed it
    assert p.read_bytes() == b'{"a": 1}\n'


def test_a_failing_fsync_cuts_the_line_back(tmp_path, monkeypatch):
    """The line written whole but not on disk (fsync fails, a read-only remount): it is cut back too."""
    p = tmp_path / "stress.jsonl"
    p.write_bytes(b'{"a": 1}\n')
    with jsonl.open_append(p) as fh:
        def read_only(real, d):
            raise OSError(errno.EROFS, "Read-only file system")

        _fail_on(fh.fileno(), monkeypatch, "fsync", read_only)
        with pytest.raises(HarnessError, match=r"cannot write results to .*stress\.jsonl: Read-only file system$"):
            jsonl.write_line(fh.fileno(), b'{"b": 2}', p)
    assert p.read_bytes() == b'{"a": 1}\n'


def test_an_error_without_its_text_is_named_by_itself(tmp_path, monkeypatch):
    p = tmp_path / "stress.jsonl"
    with jsonl.open_append(p) as fh:
        def bare(real, d, view):
            raise OSError("the device went away")

        _fail_on(fh.fileno(), monkeypatch, "write", bare)
        with pytest.raises(HarnessError) as exc:
            jsonl.write_line(fh.fileno(), b"{}", p)
    assert str(exc.value) == f"cannot write results to {p}: the device went away"
    assert p.read_bytes() == b""


def test_a_file_that_cannot_be_opened_is_one_clear_error(tmp_path):
    p = tmp_path / "missing" / "compile.jsonl"
    with pytest.raises(HarnessError) as exc:
        jsonl.open_append(p)
    assert str(exc.value) == f"cannot write results to {p}: No such file or directory"
    with pytest.raises(HarnessError, match="cannot write results to"):
        jsonl.append_line(p, b"{}")
    assert not p.parent.exists()


# ----------------------------------------------------------------------------- lines and a torn tail


@pytest.mark.parametrize("data,lines,tail", [
    (b"", [], None),
    (b"\n", [b""], None),
    (b'{"a": 1}\n{"b": 2}\n', [b'{"a": 1}', b'{"b": 2}'], None),
    (b'{"a": 1}\n{"b": ', [b'{"a": 1}'], b'{"b": '),  # a write cut short
    (b'{"a": 1}', [], b'{"a": 1}'),  # a whole line lacking its newline is a tail too: the caller judges it
    (b'{"a": 1}\n\n{"b": 2}\n', [b'{"a": 1}', b"", b'{"b": 2}'], None),  # an empty line is a line
    (b'{"a": 1}\r\n', [b'{"a": 1}\r'], None),  # only \n ends a line
])
def test_bytes_split_into_complete_lines_and_a_torn_tail(data, lines, tail):
    assert jsonl.split_lines(data) == (lines, tail)


def test_a_torn_tail_is_cut_and_fsynced(tmp_path, monkeypatch):
    p = tmp_path / "compile.jsonl"
    data = b'{"a": 1}\n{"b": 2}\n{"c": '
    p.write_bytes(data)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(jsonl.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    _, tail = jsonl.split_lines(data)
    assert tail is not None
    jsonl.cut_tail(p, data, tail)
    assert p.read_bytes() == b'{"a": 1}\n{"b": 2}\n' and len(synced) == 1


def test_cutting_a_tail_cuts_exactly_its_bytes(tmp_path):
    """The cut is the tail's length from the end of what was read: a tail of multi-byte text is cut
    whole, nothing before it."""
    p = tmp_path / "stress.jsonl"
    data = '{"a": "é"}\n{"b": "ü'.encode()
    p.write_bytes(data)
    jsonl.cut_tail(p, data, jsonl.split_lines(data)[1] or b"")
    assert p.read_bytes() == '{"a": "é"}\n'.encode()


def test_a_last_line_is_completed_and_fsynced(tmp_path, monkeypatch):
    p = tmp_path / "stress.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b": 2}')
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(jsonl.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    jsonl.end_line(p)
    assert p.read_bytes() == b'{"a": 1}\n{"b": 2}\n' and len(synced) == 1
    assert jsonl.split_lines(p.read_bytes()) == ([b'{"a": 1}', b'{"b": 2}'], None)


def test_sync_flushes_what_python_buffered(tmp_path):
    p = tmp_path / "stress.jsonl"
    with open(p, "ab") as fh:
        fh.write(b"{}\n")
        jsonl.sync(fh)
        assert Path(p).read_bytes() == b"{}\n"  # on the file before it is closed
