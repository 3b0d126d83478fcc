"""Unified diffs as the patch series holds them: the hunks of a patch file, the files a series
touches, and the smallest tree a patch applies to. A leaf module (no git, no subprocess), read
by apply (naming the hunk that failed), patchcheck, jaxvenv, jaxsuite and xlatest."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.M)


@dataclass(frozen=True)
class Hunk:
    file: str
    number: int  # 1-based within its file
    old_start: int
    preimage: str  # context and removed lines: what the hunk expects to find
    postimage: str

    @property
    def creates_file(self) -> bool:
        """A hunk against /dev/null (``@@ -0,0 +1,N @@``): its file need not exist beforehand."""
        return self.old_start == 0 and not self.preimage


def parse_patch(text: str) -> list[Hunk]:
    """Hunks of a unified diff (git format-patch or plain git diff)."""
    hunks: list[Hunk] = []
    current_file = None
    number = 0
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _DIFF_FILE.match(line.rstrip("\n"))
        if m:
            current_file, number = m.group(2), 0
            i += 1
            continue
        h = _HUNK.match(line)
        if h and current_file:
            number += 1
            old_n = int(h.group(2)) if h.group(2) is not None else 1
            new_n = int(h.group(4)) if h.group(4) is not None else 1
            pre, post = [], []
            i += 1
            while i < len(lines) and (old_n > 0 or new_n > 0):
                body = lines[i]
                tag, rest = body[:1], body[1:]
                if tag == " ":
                    pre.append(rest)
                    post.append(rest)
                    old_n -= 1
                    new_n -= 1
                elif tag == "-":
                    pre.append(rest)
                    old_n -= 1
                elif tag == "+":
                    post.append(rest)
                    new_n -= 1
                elif tag == "\\":
                    pass
                else:
                    break
                i += 1
            hunks.append(Hunk(current_file, number, int(h.group(1)), "".join(pre), "".join(post)))
            continue
        i += 1
    return hunks


def touched_files(patches: list[Path]) -> list[str]:
    """The files the patch files change, each once, in the order the series first touches them."""
    out: list[str] = []
    for p in patches:
        for h in parse_patch(p.read_text(encoding="utf-8")):
            if h.file not in out:
                out.append(h.file)
    return out


def preimage_tree(patch_text: str, root: Path) -> None:
    """Write, for each file of the patch, a file made of its hunks' pre-images in order:
    the smallest tree the patch applies to (used by tests and the consistency check). Files
    the patch creates are left out."""
    by_file: dict[str, list[str]] = {}
    for h in parse_patch(patch_text):
        if not h.creates_file:
            by_file.setdefault(h.file, []).append(h.preimage)
    for f, parts in by_file.items():
        path = root / f
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(parts), encoding="utf-8")
