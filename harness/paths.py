"""Paths as committed evidence shows them: this repository's relative, the home folder as ``~``."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shown(text: str) -> str:
    """``text`` with this repository's absolute path made relative and the home folder written ``~``."""
    text = text.replace(f"{REPO}/", "").replace(str(REPO), ".")
    home = str(Path.home())
    return text.replace(home + "/", "~/") if home not in ("/", "") else text
