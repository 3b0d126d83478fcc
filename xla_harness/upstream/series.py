"""The patch series: ``patches/series.toml`` parsed and validated.

Schema (version 1)::

    schema = 1

    [upstream.<name>]            # name: xla | jax | tensorflow
    clone_url = "https://..."    # where the build pipeline clones from
    base = "..."                 # how the base commit is derived, in words
    base_ref = "..."             # tag or commit the series was made against
    base_sha256 = "..."          # optional: sha256 of the base tarball
    checked_against = "..."      # optional: newest upstream commit the series was checked on

    [[upstream.<name>.patches]]
    file = "xla/0001-....patch"   # relative to patches/
    purpose = "..."
    series = "default"           # or "experimental"
    status = "..."               # upstream status, in words
    links = ["https://..."]      # upstream issues / PRs
    validate = ["..."]           # commands that validate the patch (shown, not run blindly)
    bazel_targets = ["//..."]    # test targets the patch touches (the build pipeline runs them)

    [[upstream.<name>.variants]] # optional: the series adapted to another base
    base_ref = "jax-v0.9.0.1"    # the jax tag it is for (for xla: the XLA commit that tag pins)
    base_sha256 = "..."          # optional: sha256 of that base's tarball (jax: the PyPI sdist)
    commit = "<40 hex digits>"   # optional: the upstream commit of the base
    adapted = "..."              # what differs from the series' own files, in words
    files = ["jax/v0.9.0.1/0001-....patch", "jax/0002-....patch"]
                                 # one per patch of the series, in its order, same file names:
                                 # the series' own file where it applies unchanged, else a file
                                 # whose mail header says `X-Base-Ref: <base_ref>`; an
                                 # experimental patch with no file is not available at that base

    [[upstream.<name>.bases]]    # optional: what was run on which upstream commit
    commit = "<40 hex digits>"
    what = "..."                 # which commit this is, in words
    series = "default"           # the series that was run
    variant = "jax-v0.9.0.1"     # optional: the variant that was run (base_ref); none: the series' own files
    applies = true               # git apply of the whole series
    compiles = true              # the patched files compile (make xla-test; jax: the patched venv builds)
    tests_pass = true            # their unit tests pass
    command = "make xla-test ..."
    evidence = "results/..."     # the log of that run

Which files are applied: ``Upstream.select(series, base_ref)``. The series' own files for its
``base_ref`` (or when no base is named), the variant's files for a variant's ``base_ref``, and
for any other base one error naming the bases there are: a series is never applied to a base
it was not made for. Any patch file whose mail header carries ``X-Base-Ref:`` must name the
base it is declared for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_harness.errors import HarnessError
from xla_harness.runtime.resources import patches_dir

SERIES_KINDS = ("default", "experimental")
UPSTREAMS = ("xla", "jax", "tensorflow")
PATCHES_DIR = patches_dir()  # the checkout's patches/, or the wheel's xla_harness/_data/patches


@dataclass(frozen=True)
class Patch:
    file: str
    purpose: str
    series: str
    status: str
    links: tuple[str, ...] = ()
    validate: tuple[str, ...] = ()
    bazel_targets: tuple[str, ...] = ()

    def path(self, root: Path) -> Path:
        return root / self.file


@dataclass(frozen=True)
class BaseCheck:
    commit: str
    what: str
    series: str
    applies: bool
    compiles: bool
    tests_pass: bool
    command: str
    evidence: str
    variant: str = ""  # base_ref of the variant that was run; "" = the series' own files


@dataclass(frozen=True)
class Variant:
    """The series adapted to another base: ``files[i]`` replaces the series' i-th patch file
    ("" where an experimental patch has no version for this base)."""
    base_ref: str
    files: tuple[str, ...]
    adapted: str
    base_sha256: str = ""
    commit: str = ""


@dataclass(frozen=True)
class Upstream:
    name: str
    clone_url: str
    base: str
    base_ref: str
    base_sha256: str = ""
    checked_against: str = ""
    patches: tuple[Patch, ...] = ()
    bases: tuple[BaseCheck, ...] = ()
    variants: tuple[Variant, ...] = ()

    def base_refs(self) -> tuple[str, ...]:
        """Every base this upstream's series exists for: its own, then its variants'."""
        return (self.base_ref, *(v.base_ref for v in self.variants))

    def variant(self, base_ref: str) -> Variant | None:
        """The variant for ``base_ref``; None for the series' own base. Any other base is an error."""
        if base_ref == self.base_ref:
            return None
        for v in self.variants:
            if v.base_ref == base_ref:
                return v
        raise HarnessError(f"series.toml has no {self.name} series for {base_ref}: it exists for "
                           f"{', '.join(self.base_refs())} (add a [[upstream.{self.name}.variants]] for it)")

    def base_sha256_for(self, base_ref: str) -> str:
        v = self.variant(base_ref)
        return self.base_sha256 if v is None else v.base_sha256

    def select(self, series: str, base_ref: str | None = None) -> tuple[Patch, ...]:
        """Patches applied for ``series``: default only, or default + experimental; with
        ``base_ref``, their files for that base (a variant's, or an error if none exists)."""
        if series not in SERIES_KINDS:
            raise HarnessError(f"unknown series {series!r}; expected one of {', '.join(SERIES_KINDS)}")
        variant = self.variant(base_ref) if base_ref is not None else None
        chosen = []
        for i, p in enumerate(self.patches):
            if series == "default" and p.series != "default":
                continue
            if variant is not None:
                if not variant.files[i]:
                    raise HarnessError(f"the {series} series of {self.name} is not available for "
                                       f"{variant.base_ref}: its variant has no version of {p.file}")
                p = dataclasses.replace(p, file=variant.files[i])
            chosen.append(p)
        return tuple(chosen)


@dataclass(frozen=True)
class Series:
    root: Path
    upstreams: dict[str, Upstream] = field(default_factory=dict)

    def upstream(self, name: str) -> Upstream:
        try:
            return self.upstreams[name]
        except KeyError:
            raise HarnessError(
                f"series.toml has no upstream {name!r}; known: {', '.join(sorted(self.upstreams))}"
            ) from None

    def fingerprint(self, name: str, series: str = "default", base_ref: str | None = None) -> str:
        """sha256 over the selected patch files' names and bytes: identifies a prepared tree."""
        h = hashlib.sha256()
        for p in self.upstream(name).select(series, base_ref):
            h.update(p.file.encode() + b"\0")
            h.update(p.path(self.root).read_bytes())
        return h.hexdigest()


def _str(table: dict, key: str, where: str, required: bool = True) -> str:
    value = table.get(key, "")
    if not isinstance(value, str) or (required and not value):
        raise HarnessError(f"{where}: '{key}' must be a non-empty string")
    return value


def _strs(table: dict, key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise HarnessError(f"{where}: '{key}' must be a list of strings")
    return tuple(value)


def _tables(table: dict, key: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    """``table[key]`` as an array of tables: (where each one is, the table); anything else is one error."""
    raw = table.get(key, [])
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise HarnessError(f"{where}: '{key}' must be an array of tables")
    return [(f"{where}.{key}[{i}]", t) for i, t in enumerate(raw)]


def _bases(table: dict, where: str) -> tuple[BaseCheck, ...]:
    out = []
    for bw, b in _tables(table, "bases", where):
        flags: dict[str, Any] = {k: b.get(k) for k in ("applies", "compiles", "tests_pass")}
        bad = [k for k, v in flags.items() if not isinstance(v, bool)]
        if bad:
            raise HarnessError(f"{bw}: '{bad[0]}' must be true or false")
        commit = _hex40(_str(b, "commit", bw), bw)
        series = _str(b, "series", bw)
        if series not in SERIES_KINDS:
            raise HarnessError(f"{bw}: series must be one of {', '.join(SERIES_KINDS)}, not {series!r}")
        out.append(BaseCheck(commit=commit, what=_str(b, "what", bw), series=series, command=_str(b, "command", bw),
                             evidence=_str(b, "evidence", bw, required=False),
                             variant=_str(b, "variant", bw, required=False), **flags))
    return tuple(out)


X_BASE_REF = re.compile(r"^X-Base-Ref:[ \t]*(\S+)[ \t]*$", re.MULTILINE)


def declared_base(text: str) -> str:
    """The base a patch file's mail header names (``X-Base-Ref: <ref>``); "" when it names none."""
    header = text.split("\n\n", 1)[0]
    m = X_BASE_REF.search(header)
    return m.group(1) if m else ""


def _hex40(value: str, where: str) -> str:
    if len(value) != 40 or any(c not in "0123456789abcdef" for c in value):
        raise HarnessError(f"{where}: 'commit' must be 40 lowercase hex digits")
    return value


def _variants(table: dict, where: str, patches: list[Patch], base_ref: str) -> tuple[Variant, ...]:
    out: list[Variant] = []
    seen = {base_ref}
    for vw, v in _tables(table, "variants", where):
        ref = _str(v, "base_ref", vw)
        if ref in seen:
            raise HarnessError(f"{vw}: base_ref {ref!r} is already "
                               + ("the series' own base" if ref == base_ref else "another variant's"))
        seen.add(ref)
        sha = _str(v, "base_sha256", vw, required=False)
        if sha and not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise HarnessError(f"{vw}: 'base_sha256' must be 64 lowercase hex digits")
        commit = _str(v, "commit", vw, required=False)
        if commit:
            _hex40(commit, vw)
        files = list(_strs(v, "files", vw))
        # files name the series' patches in order, by file name; experimental ones may be absent
        full: list[str] = []
        for p in patches:
            name = p.file.rsplit("/", 1)[-1]
            if files and files[0].rsplit("/", 1)[-1] == name:
                full.append(files.pop(0))
            elif p.series == "default":
                raise HarnessError(f"{vw}: no file for {p.file} (files name the series' patches in order, "
                                   f"by file name; got {files[0] if files else 'none left'})")
            else:
                full.append("")
        if files:
            raise HarnessError(f"{vw}: {files[0]} is not a patch of the series (or is out of order)")
        out.append(Variant(base_ref=ref, files=tuple(full), adapted=_str(v, "adapted", vw),
                           base_sha256=sha, commit=commit))
    return tuple(out)


def _check_declared_bases(up: Upstream, root: Path, where: str) -> None:
    """A patch file naming a base in its header is declared for that base, and every file a
    variant adds (one that is not the series' own) names it: a file for another base is refused."""
    own = {p.file for p in up.patches}
    claims: list[tuple[str, str]] = [(p.file, up.base_ref) for p in up.patches]
    claims += [(f, v.base_ref) for v in up.variants for f in v.files if f and f not in own]
    for file, ref in claims:
        said = declared_base((root / file).read_text(encoding="utf-8", errors="replace"))
        if said and said != ref:
            raise HarnessError(f"{where}: {file} says X-Base-Ref: {said}, but is declared for {ref}")
        if not said and file not in own:
            raise HarnessError(f"{where}: {file} (variant for {ref}) has no 'X-Base-Ref: {ref}' in its header")


def read_toml(path: Path) -> dict:
    """A TOML file as a dict; unreadable, non-UTF-8 or malformed files are one HarnessError."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HarnessError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise HarnessError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"{path}: malformed TOML: {exc}") from None


def _patches(table: dict, where: str, root: Path, check_files: bool) -> list[Patch]:
    patches = []
    for pw, p in _tables(table, "patches", where):
        series = _str(p, "series", pw)
        if series not in SERIES_KINDS:
            raise HarnessError(f"{pw}: series must be one of {', '.join(SERIES_KINDS)}, not {series!r}")
        patch = Patch(
            file=_str(p, "file", pw),
            purpose=_str(p, "purpose", pw),
            series=series,
            status=_str(p, "status", pw),
            links=_strs(p, "links", pw),
            validate=_strs(p, "validate", pw),
            bazel_targets=_strs(p, "bazel_targets", pw),
        )
        if check_files and not patch.path(root).is_file():
            raise HarnessError(f"{pw}: patch file {patch.file} is missing")
        patches.append(patch)
    return patches


def _upstream(name: str, table: dict, where: str, root: Path, check_files: bool) -> Upstream:
    patches = _patches(table, where, root, check_files)
    base_ref = _str(table, "base_ref", where)
    variants = _variants(table, where, patches, base_ref)
    if check_files:
        for v in variants:
            missing = [f for f in v.files if f and not (root / f).is_file()]
            if missing:
                raise HarnessError(f"{where}: variant {v.base_ref}: patch file {missing[0]} is missing")
    bases = _bases(table, where)
    refs = {v.base_ref for v in variants}
    for i, b in enumerate(bases):
        if b.variant and b.variant not in refs:
            raise HarnessError(f"{where}.bases[{i}]: variant {b.variant!r} is not a variant of the series "
                               f"(variants: {', '.join(sorted(refs)) or 'none'})")
    up = Upstream(
        name=name,
        clone_url=_str(table, "clone_url", where),
        base=_str(table, "base", where),
        base_ref=base_ref,
        base_sha256=_str(table, "base_sha256", where, required=False),
        checked_against=_str(table, "checked_against", where, required=False),
        patches=tuple(patches),
        bases=bases,
        variants=variants,
    )
    if check_files:
        _check_declared_bases(up, root, where)
    return up


def load_series(path: Path | str | None = None, check_files: bool = True) -> Series:
    """Parse and validate series.toml; raise HarnessError naming the first problem."""
    path = Path(path) if path is not None else PATCHES_DIR / "series.toml"
    data = read_toml(path)
    if data.get("schema") != 1:
        raise HarnessError(f"{path}: 'schema = 1' is required")
    ups = data.get("upstream")
    if not isinstance(ups, dict) or not ups:
        raise HarnessError(f"{path}: no [upstream.<name>] tables")
    root = path.parent
    upstreams: dict[str, Upstream] = {}
    for name, table in ups.items():
        where = f"{path.name}: upstream.{name}"
        if name not in UPSTREAMS:
            raise HarnessError(f"{where}: unknown upstream; expected one of {', '.join(UPSTREAMS)}")
        upstreams[name] = _upstream(name, table, where, root, check_files)
    return Series(root=root, upstreams=upstreams)
