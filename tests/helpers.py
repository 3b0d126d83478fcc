"""Small shared settings for the tests: a tiny model that compiles in about a second, and
`git am` of a PR bundle's mbox onto a patch's pre-images."""

import subprocess
from pathlib import Path

TINY = dict(vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8)
TINY_ARGS = ["--vocab", "64", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "8",
             "--batch", "8"]


def git_am(patch_text: str, mbox: Path, repo: Path) -> subprocess.CompletedProcess:
    """`git am` the mbox onto a fresh repository holding the pre-images of ``patch_text``."""
    from harness.upstream.patchcheck import preimage_tree

    preimage_tree(patch_text, repo)
    ident = ["-c", "user.email=t@t", "-c", "user.name=t"]
    for argv in (["init", "-q"], ["add", "-A"], [*ident, "commit", "-qm", "base"]):
        subprocess.run(["git", *argv], cwd=repo, check=True)
    return subprocess.run(["git", *ident, "am", str(mbox)], cwd=repo, capture_output=True, text=True)
