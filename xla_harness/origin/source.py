"""Where an equation of a failing step lies in source: the innermost frame in the user's own files
(:func:`locate`), the library frame the equation itself lies in (optax, flax), and that place as an
origin's text says it (:func:`where_text`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from xla_harness.origin.births import Site


def _library(path: str) -> bool:
    """A frame in an installed package (site-packages) or in the harness itself (step_from_loss)."""
    parts = path.replace("\\", "/").split("/")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return "site-packages" in parts or "dist-packages" in parts or os.path.abspath(path).startswith(here + os.sep)


def _within(path: str, folders: Sequence[str]) -> bool:
    p = os.path.realpath(path)
    return any(p == f or p.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _package(path: str) -> str:
    """The installed package a library frame lies in (``optax``), or the harness's folder."""
    parts = path.replace("\\", "/").split("/")
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts and parts.index(anchor) + 1 < len(parts):
            return parts[parts.index(anchor) + 1]
    return os.path.dirname(path)


def locate(site: Site, user_folders: Sequence[str] = ()) -> dict:
    """``{"file", "line", "function", "primitive", "library"}`` of an equation: the innermost frame in
    the user's own files (under ``user_folders`` when given, else any frame outside installed
    packages and the harness), and where the equation itself lies in a library (optax, flax), that
    library frame as ``library``. With no frame of the user's, the nearest frame outside the package
    that made the equation (its caller: the harness's ``step_from_loss`` calling optax, say), whatever
    called the trace from further out."""
    folders = [os.path.realpath(f) for f in user_folders]
    frames = site.frames
    none = {"file": None, "line": None, "function": None, "primitive": site.primitive, "library": None}
    if not frames:
        return none
    user = next((f for f in frames if not _library(f.file) and (not folders or _within(f.file, folders))), None)
    inner = frames[0]
    if user is not None:
        library = inner.to_json() if inner != user and _library(inner.file) else None
        return {**user.to_json(), "primitive": site.primitive, "library": library}
    caller = next((f for f in frames if _package(f.file) != _package(inner.file)), None)
    if caller is None:
        return {**inner.to_json(), "primitive": site.primitive, "library": None}
    return {**caller.to_json(), "primitive": site.primitive, "library": inner.to_json()}


def where_text(where: dict | None) -> str:
    if not where or where.get("file") is None:
        return "no source line recorded"
    text = f"{where['file']}:{where['line']}"
    lib = where.get("library")
    if lib:
        text += f" (in {_short(lib['file'])}:{lib['line']}, {lib['function']})"
    return text


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    return path
