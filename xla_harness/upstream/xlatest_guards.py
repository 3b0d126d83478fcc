"""The guards of patches/xla/guards.toml (make xla-mutants): each names code a patch adds whose
deletion some new test must notice; loaded, respelled for a variant's base, and mutated here."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime.resources import patches_dir
from xla_harness.upstream.series import Upstream

GUARDS_FILE = patches_dir() / "xla" / "guards.toml"


@dataclass(frozen=True)
class GuardAt:
    """A guard as it is at a variant's base: its own ``find``/``replace`` (the variant spells the
    guarded code otherwise), or ``absent``, why the guarded code has no counterpart there."""

    find: str = ""
    replace: str = ""
    absent: str = ""


@dataclass(frozen=True)
class Guard:
    patch: str  # file of the patch, as in series.toml
    file: str  # patched source file the guard lives in
    name: str
    find: str  # exact text in the patched file
    replace: str  # what it becomes in the mutant
    at: tuple[tuple[str, GuardAt], ...] = ()  # (base_ref of a variant, the guard there)

    def at_base(self, base_ref: str) -> GuardAt | None:
        return dict(self.at).get(base_ref)


def _guard_at(g: dict, where: str) -> tuple[tuple[str, GuardAt], ...]:
    at = g.get("at", {})
    if not isinstance(at, dict):
        raise HarnessError(f"{where}: 'at' must be a table of [guard.at.\"<base_ref>\"] tables")
    out = []
    for ref, spec in at.items():
        if not isinstance(spec, dict) or set(spec) - {"find", "replace", "absent"}:
            raise HarnessError(f"{where}: at.{ref} takes find and replace, or absent (why the guard has no "
                               "counterpart at that base)")
        if any(not isinstance(v, str) for v in spec.values()):
            raise HarnessError(f"{where}: at.{ref}: find, replace and absent are strings")
        absent, find = spec.get("absent", ""), spec.get("find", "")
        if bool(absent) == bool(find) or (absent and "replace" in spec):
            raise HarnessError(f"{where}: at.{ref} needs either a non-empty find (with its replace) or a "
                               "non-empty absent, not both")
        out.append((ref, GuardAt(find, spec.get("replace", ""), absent)))
    return tuple(out)


def load_guards(path: Path = GUARDS_FILE) -> list[Guard]:
    from xla_harness.upstream.series import read_toml

    data = read_toml(path)
    guards = []
    for i, g in enumerate(data.get("guard", [])):
        missing = [k for k in ("patch", "file", "name", "find") if not isinstance(g.get(k), str) or not g.get(k)]
        if missing or not isinstance(g.get("replace", ""), str):
            raise HarnessError(f"{path.name}: guard[{i}] needs non-empty strings patch, file, name, find")
        guards.append(Guard(g["patch"], g["file"], g["name"], g["find"], g.get("replace", ""),
                            _guard_at(g, f"{path.name}: guard[{i}] ({g['name']})")))
    return guards


def guards_for_base(guards: list[Guard], up: Upstream,
                    base_ref: str | None) -> tuple[list[Guard], list[tuple[Guard, str]]]:
    """The guards to mutate for the default series at ``base_ref`` (None: the series' own files),
    spelled as there, and the guards that have no counterpart there, each with its reason.

    A guard is written for a patch of the series. At a variant's base it guards the variant's file
    for that patch: as written, or with the ``find``/``replace`` of its [guard.at."<base_ref>"]
    table, whose ``absent`` instead says why that base has no such code (the guard is then listed,
    not mutated). A variant that uses the series' own file takes its guards as written."""
    variant = up.variant(base_ref) if base_ref else None
    own = [p.file for p in up.patches]
    chosen: list[Guard] = []
    absent: list[tuple[Guard, str]] = []
    for g in guards:
        if g.patch not in own:
            raise HarnessError(f"guard {g.name!r} names {g.patch}, which is not a patch of the series "
                               "(a variant's guard is written for the series' patch, with [guard.at.\"<base_ref>\"])")
        unknown = [ref for ref, _ in g.at if ref not in up.base_refs() or ref == up.base_ref]
        if unknown:
            raise HarnessError(f"guard {g.name!r}: at.{unknown[0]} is not a variant of the series")
        if variant is None:
            chosen.append(g)
            continue
        file = variant.files[own.index(g.patch)]
        if not file:
            continue
        at = g.at_base(variant.base_ref)
        if at is not None and at.absent:
            absent.append((g, at.absent))
            continue
        find, replace = (at.find, at.replace) if at is not None else (g.find, g.replace)
        chosen.append(dataclasses.replace(g, patch=file, find=find, replace=replace, at=()))
    return chosen, absent


def mutate(text: str, guard: Guard) -> str:
    """The patched file with one guard deleted; the guard's text must occur exactly once."""
    n = text.count(guard.find)
    if n != 1:
        raise HarnessError(f"guard {guard.name!r} of {guard.patch}: its text occurs {n} times in "
                           f"{guard.file} (expected once); update patches/xla/guards.toml")
    return text.replace(guard.find, guard.replace)


def check_guards_cover(guards: list[Guard], patch_files: Iterable[str]) -> list[str]:
    """Default patches with no guard listed: a patch nobody mutates is a gap, not a pass."""
    covered = {g.patch for g in guards}
    return [p for p in patch_files if p not in covered]
