"""Apply one patch to a tree with ``git apply``: check first, then apply, and on failure name the
patch, the file and the hunk in one sentence. The one place the series is applied, by
patchcheck (scratch copies), jaxvenv (the jax sdist) and jaxlib_build (the trees it builds)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.upstream.patchfile import parse_patch

_FAILED = re.compile(r"patch failed: (\S+?):(\d+)")


def git(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run git with argv ``args`` in ``cwd``; git missing or hanging (its process group is killed after
    ``timeout`` s, :mod:`xla_harness.runtime.subproc`) is one clear error."""
    try:
        return subproc.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           what=f"git {args[0]} in {cwd}")
    except FileNotFoundError:
        raise HarnessError("git is not installed; it is needed to apply patches") from None


def init_repo(dest: Path) -> None:
    """``git init`` in ``dest`` (a copied tree that ``git apply`` then patches)."""
    res = git(["init", "-q"], dest)
    if res.returncode != 0:
        raise HarnessError(f"git init in {dest} failed: {(res.stderr.strip().splitlines() or ['no output'])[-1]}")


def describe_failure(name: str, patch_text: str, stderr: str) -> str:
    """``git apply --check``'s complaint as one sentence naming the patch, file and hunk."""
    m = _FAILED.search(stderr)
    if m:
        file, line = m.group(1), int(m.group(2))
        for h in parse_patch(patch_text):
            if h.file == file and h.old_start == line:
                return f"{name}: hunk #{h.number} of {file} (at line {line}) does not apply"
        return f"{name}: {file} at line {line} does not apply"
    first = next((ln for ln in stderr.splitlines() if ln.strip()), "git apply failed")
    return f"{name}: {first.removeprefix('error: ')}"


def apply_patch(patch: Path, tree: Path, name: str | None = None) -> None:
    """``git apply --check`` then ``git apply`` of ``patch`` in ``tree`` (a git work tree)."""
    name = name or patch.name
    res = git(["apply", "--check", str(patch)], tree)
    if res.returncode != 0:
        raise HarnessError(describe_failure(name, patch.read_text(encoding="utf-8"), res.stderr))
    res = git(["apply", str(patch)], tree)
    if res.returncode != 0:
        raise HarnessError(f"{name}: git apply failed after its check passed: {res.stderr.strip()}")
