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
Nothing else in the text changes, so instruction counts, layouts and aliasing read the same."""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

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


def publish(path: Path) -> Path:
    """Scrub ``path`` (``.txt`` or ``.txt.gz``) and write it gzipped; returns the ``.gz`` written."""
    gz = path.name.endswith(".gz")
    text = gzip.decompress(path.read_bytes()).decode("utf-8") if gz else path.read_text(encoding="utf-8")
    out = path if gz else path.with_name(path.name + ".gz")
    clean = scrub(text)
    if gz and clean == text:  # already clean: the committed bytes stay as they are
        return out
    out.write_bytes(gzip.compress(clean.encode("utf-8"), mtime=0))
    if not gz:
        path.unlink()
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("error: usage: python tools/publish_hlo.py FILE_OR_DIR... (compiler dumps to scrub and gzip)",
              file=sys.stderr)
        return 2
    files: list[Path] = []
    for arg in map(Path, argv):
        if not arg.exists():
            print(f"error: {arg}: no such file or directory", file=sys.stderr)
            return 2
        files += sorted(p for p in arg.rglob("*") if DUMP.search(p.name)) if arg.is_dir() else [arg]
    for f in files:
        publish(f)
    print(f"publish_hlo: {len(files)} file(s) scrubbed and gzipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
