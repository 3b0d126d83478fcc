"""Where the harness finds its own files, installed from a wheel or run from its source checkout.

* ``patches_dir()``: the patch series (``series.toml``, ``xla/guards.toml``, the ``.patch``
  files). In this project's own checkout (an editable install, ``PYTHONPATH=.``) that is the
  top-level ``patches/``; from a wheel it is the copy that setup.py's build_py puts at
  ``xla_harness/_data/patches``.
* ``source_checkout()``: this project's checkout, or None when the package runs from
  site-packages. It is recognised by a ``pyproject.toml`` naming the project ``xla-harness``
  beside the package folder, so a user's own repository (the cwd, or a parent of a venv)
  is never taken for it.
* ``import_root()``: the folder that holds the ``xla_harness`` package (the checkout, or
  site-packages): what a child interpreter needs on ``PYTHONPATH`` and where the bundle copies
  the package's own files from.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources
from pathlib import Path

PROJECT = "xla-harness"
PACKAGE = "xla_harness"
PACKAGED_PATCHES = ("_data", "patches")

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def import_root() -> Path:
    """The folder holding the ``xla_harness`` package (site-packages, or the source checkout)."""
    return _PACKAGE_DIR.parent


@lru_cache(maxsize=1)
def source_checkout() -> Path | None:
    """This project's source checkout when the package runs from one, else None."""
    root = import_root()
    try:
        meta = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    project = meta.get("project")
    if not isinstance(project, dict) or project.get("name") != PROJECT:
        return None
    return root


def patches_dir() -> Path:
    """The patch series folder: the checkout's ``patches/``, else the wheel's packaged copy."""
    checkout = source_checkout()
    if checkout is not None and (checkout / "patches").is_dir():
        return checkout / "patches"
    packaged = resources.files(PACKAGE).joinpath(*PACKAGED_PATCHES)
    # An installed wheel unpacks onto the file system, so this is a real folder; a package
    # imported from a zip has none (the error then names the path that is missing).
    return packaged if isinstance(packaged, Path) else _PACKAGE_DIR.joinpath(*PACKAGED_PATCHES)
