"""Check that the patch series applies to source trees, in order, with ``git apply --check``.

Only the files a series touches are copied into a scratch git repository, so checking
against a full XLA checkout is fast. A patch that does not apply is reported as one line
naming the patch, the file and the hunk. An upstream for which no tree was given is
reported as "not checked", never as passing; a tree that was given but against which no patch
could be checked is an error (:func:`nothing_checked`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.upstream.apply import apply_patch, git
from xla_harness.upstream.patchfile import parse_patch, touched_files
from xla_harness.upstream.series import Series, Upstream


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



def nothing_checked(upstream: str, tree: Path | None, results: list[CheckResult]) -> str | None:
    """The error for a source tree that was given but against which no patch applied: every patch
    "not checked" (or none selected) checks nothing, and a check asked for must not pass that way.
    None when no tree was given (nothing was asked) or when a patch was checked."""
    if tree is None or any(r.status == "applies" for r in results):
        return None
    why = results[0].detail if results else "no patches"
    return f"{upstream}: no patch was checked against {tree} ({why}); nothing was checked"
