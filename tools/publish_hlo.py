#!/usr/bin/env python3
"""Prepare compiler dumps for results/: the stack-frame file table names no path of this machine,
and the text is gzipped.

    python tools/publish_hlo.py FILE_OR_DIR...

Every compiler dump under the arguments (``*_optimizations*.txt``: HLO, buffer assignment)
becomes ``*.txt.gz`` (gzip with no name or time in its header, so the bytes depend on the text
only); a ``*.txt.gz`` is rewritten in place when its text changes. XLA prints the source files of
the op metadata as lines ``N "/abs/path"`` after the last computation; each such path becomes
``<site-packages>/...`` (a package), ``xla_harness/...`` (this repository) or ``<venv>/bin/NAME``
(an entry point), anything else ``<path>/BASENAME``.
Nothing else in the text changes, so instruction counts, layouts and aliasing read the same.

The same promises as the CLI: every argument and every dump is checked before any file is written
(a file not named like a dump, one that is not a regular file, not UTF-8 text or not a whole gzip
stream is refused), a ``.txt`` whose ``.txt.gz`` already exists is refused rather than replaced, a
``.gz`` is rewritten through a temporary file, and a refusal is one ``error:`` line, exit 2.
"""

from __future__ import annotations

import gzip
import os
import re
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package (the tool is run from a checkout)

from xla_harness.errors import HarnessError  # noqa: E402
from xla_harness.runtime.files import MAX_READ_BYTES, read_regular  # noqa: E402

DUMP = re.compile(r"_optimizations[^/]*\.txt(\.gz)?$")  # XLA's dump names: *.after_optimizations*.txt
FILE_ENTRY = re.compile(r'^(\d+) "(/[^"\n]*)"$', re.M)


def relative(path: str) -> str:
    """The machine-free name of an absolute source path of the file table."""
    if "/site-packages/" in path:
        return "<site-packages>/" + path.split("/site-packages/", 1)[1]
    if "/xla_harness/" in path:
        return "xla_harness/" + path.rsplit("/xla_harness/", 1)[1]
    m = re.search(r"/bin/([^/]+)$", path)
    if m:
        return f"<venv>/bin/{m.group(1)}"
    return "<path>/" + path.rsplit("/", 1)[-1]


def scrub(text: str) -> str:
    return FILE_ENTRY.sub(lambda m: f'{m.group(1)} "{relative(m.group(2))}"', text)


def _gunzip(path: Path, data: bytes) -> bytes:
    """The text of a gzip file, at most MAX_READ_BYTES of it; HarnessError for a stream that is not
    whole gzip."""
    try:
        d = zlib.decompressobj(wbits=31)
        out = d.decompress(data, MAX_READ_BYTES + 1)
        if len(out) > MAX_READ_BYTES:
            raise HarnessError(f"{path}: decompresses to more than {MAX_READ_BYTES} bytes; refusing it")
        if not d.eof:
            raise HarnessError(f"{path}: not a whole gzip stream (cut short?)")
        return out
    except zlib.error as exc:
        raise HarnessError(f"{path}: not gzip data ({exc})") from None


def read_dump(path: Path) -> str:
    """The text of a dump (``.txt`` or ``.txt.gz``); HarnessError for anything else."""
    data = read_regular(path)  # a FIFO, device, folder or a link to one is refused, never opened for reading
    if path.name.endswith(".gz"):
        data = _gunzip(path, data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HarnessError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                           "not a compiler dump") from None


def plan(path: Path) -> tuple[Path, str] | None:
    """(the .gz to write, its text) for one dump, or None when it is already clean; HarnessError for a
    dump that cannot be published without losing or replacing a file."""
    if not DUMP.search(path.name):
        raise HarnessError(f"{path} is not named like a compiler dump (*_optimizations*.txt or .txt.gz); "
                           "refusing to touch it")
    text = read_dump(path)
    gz = path.name.endswith(".gz")
    out = path if gz else path.with_name(path.name + ".gz")
    clean = scrub(text)
    if gz:
        return None if clean == text else (out, clean)  # already clean: the committed bytes stay
    if out.exists() or out.is_symlink():
        raise HarnessError(f"{out} already exists; refusing to replace it with {path} gzipped (remove one)")
    return out, clean


def write(path: Path, out: Path, text: str) -> None:
    """``text`` gzipped into ``out`` through a temporary file beside it; the ``.txt`` it came from goes."""
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "xb") as fh:
        fh.write(gzip.compress(text.encode("utf-8"), mtime=0))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out)
    if out != path:
        path.unlink()


def collect(argv: list[str]) -> list[Path]:
    """The dumps the arguments name: a file as given (it must be a dump), a folder's dumps; every one
    named like a dump must be a regular file."""
    files: list[Path] = []
    for arg in map(Path, argv):
        if not (arg.exists() or arg.is_symlink()):
            raise HarnessError(f"{arg}: no such file or directory")
        if arg.is_dir() and not arg.is_symlink():
            found = sorted(p for p in arg.rglob("*") if DUMP.search(p.name))
            for p in found:
                if not p.is_file() or p.is_symlink():
                    raise HarnessError(f"{p} is not a regular file (a folder, FIFO, device or link); refusing it")
            files += found
        else:
            if arg.is_symlink() or not arg.is_file():
                raise HarnessError(f"{arg} is not a regular file (a FIFO, device or link); refusing it")
            files.append(arg)
    return files


def main(argv: list[str]) -> int:
    if not argv:
        print("error: usage: python tools/publish_hlo.py FILE_OR_DIR... (compiler dumps to scrub and gzip)",
              file=sys.stderr)
        return 2
    try:
        files = list(dict.fromkeys(collect(argv)))  # a file given twice (alone and in its folder) once
        todo = [(f, *p) for f in files if (p := plan(f)) is not None]  # everything checked before any write
        outs = [out for _, out, _ in todo]
        if len(set(outs)) != len(outs):
            dup = next(o for o in outs if outs.count(o) > 1)
            raise HarnessError(f"{dup} would be written twice (a .txt and its .txt.gz both given); give one")
        for path, out, text in todo:
            write(path, out, text)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"publish_hlo: {len(files)} file(s) scrubbed and gzipped ({len(todo)} written)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
