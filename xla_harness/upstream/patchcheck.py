"""Check that the patch series applies to source trees, in order, with ``git apply --check``.

Only the files a series touches are copied into a scratch git repository, so checking
against a full XLA checkout is fast. A patch that does not apply is reported as one line
naming the patch, the file and the hunk. An upstream for which no tree was given is
reported as "not checked", never as passing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.upstream.apply import apply_patch, git
from xla_harness.upstream.series import Series, Upstream

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


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return git(args, cwd, timeout=120)


@dataclass(frozen=True)
class CheckResult:
    upstream: str
    status: str  # "applies" | "not checked" | "fails"
    detail: str

    def line(self) -> str:
        return f"{self.upstream}: {self.status}: {self.detail}"


def check_upstream(series: Series, up: Upstream, tree: Path | None, which: str = "default") -> list[CheckResult]:
    """Apply the selected patches of one upstream, in order, to a scratch copy of ``tree``."""
    patches = up.select(which)
    if not patches:
        return [CheckResult(up.name, "not checked", f"no {which} patches in series.toml")]
    if tree is None:
        return [CheckResult(up.name, "not checked", "no source tree given")]
    tree = Path(tree)
    if not tree.is_dir():
        raise HarnessError(f"{up.name}: source tree {tree} is not a directory")
    paths = [p.path(series.root) for p in patches]
    for p, path in zip(patches, paths, strict=True):
        if not path.is_file():
            raise HarnessError(f"{p.file}: patch file is missing")
    touched = touched_files(paths)
    if touched and not any((tree / rel).is_file() for rel in touched):
        raise HarnessError(f"{up.name}: {tree} holds none of the files the series patches; not a {up.name} "
                           "source tree")
    results = []
    with tempfile.TemporaryDirectory(prefix="xla-harness-apply-") as tmp:
        scratch = Path(tmp)
        for rel in touched:
            src = tree / rel
            if src.is_file():
                dst = scratch / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        _git(["init", "-q"], scratch)
        for p, path in zip(patches, paths, strict=True):
            missing = [h.file for h in parse_patch(path.read_text(encoding="utf-8"))
                       if not h.creates_file and not (scratch / h.file).is_file()]
            if missing:
                results.append(CheckResult(up.name, "not checked", f"{p.file}: {missing[0]} is not in "
                                           f"the given tree (a PyPI sdist has no tests/)"))
                continue
            apply_patch(path, scratch, p.file)  # the next patch applies on top of this one
            results.append(CheckResult(up.name, "applies", f"{p.file} ({p.series})"))
    return results


def check_tree_commit(up: Upstream, tree: Path, expected: str) -> str | None:
    """Warning text when ``tree`` is a git checkout at another commit than ``expected``."""
    if not expected or not (tree / ".git").exists():
        return None
    head = _git(["rev-parse", "HEAD"], tree).stdout.strip()
    if head and not head.startswith(expected) and not expected.startswith(head):
        raise HarnessError(f"{up.name}: source tree {tree} is at {head[:12]}, series.toml records "
                           f"{expected[:12]}; check out the recorded commit or update series.toml")
    return None
