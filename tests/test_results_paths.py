"""Committed evidence names no path of the machine it was made on: results/ text files hold
repository-relative paths and ``~`` for the home folder, never a checkout's or a home's absolute path."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".log", ".md", ".txt", ".json", ".jsonl", ".toml"}
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:root|home/[^/\s]+|work)/")


def machine_paths(root: Path) -> list[str]:
    """``file:line`` of every results text line naming an absolute home or checkout path."""
    found = []
    for path in sorted((root / "results").rglob("*")):
        if path.suffix in TEXT and path.is_file():
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if MACHINE_PATH.search(line):
                    found.append(f"{path.relative_to(root)}:{n}")
    return found


def test_results_name_no_path_of_this_machine():
    assert machine_paths(ROOT) == []


def test_a_planted_machine_path_is_found(tmp_path):
    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "a.log").write_text("ok ~/.cache/xla-harness\nPYTHONPATH=/work/main pytest\n")
    (tmp_path / "results" / "x" / "b.md").write_text("see /root/.cache/x and results/x/a.log\n")
    (tmp_path / "results" / "x" / "c.gz").write_bytes(b"/root/ in a binary file is not read")
    assert machine_paths(tmp_path) == ["results/x/a.log:2", "results/x/b.md:1"]
