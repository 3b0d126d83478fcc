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

    [[upstream.<name>.bases]]    # optional: what was run on which upstream commit
    commit = "<40 hex digits>"
    what = "..."                 # which commit this is, in words
    series = "default"           # the series that was run
    applies = true               # git apply of the whole series
    compiles = true              # the patched files compile (make xla-test)
    tests_pass = true            # their unit tests pass
    command = "make xla-test ..."
    evidence = "results/..."     # the log of that run
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.resources import patches_dir

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

    def select(self, series: str) -> tuple[Patch, ...]:
        """Patches applied for ``series``: default only, or default + experimental."""
        if series not in SERIES_KINDS:
            raise HarnessError(f"unknown series {series!r}; expected one of {', '.join(SERIES_KINDS)}")
        if series == "default":
            return tuple(p for p in self.patches if p.series == "default")
        return self.patches


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

    def fingerprint(self, name: str, series: str = "default") -> str:
        """sha256 over the selected patch files' names and bytes: identifies a prepared tree."""
        h = hashlib.sha256()
        for p in self.upstream(name).select(series):
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


def _bases(table: dict, where: str) -> tuple[BaseCheck, ...]:
    raw = table.get("bases", [])
    if not isinstance(raw, list):
        raise HarnessError(f"{where}: 'bases' must be an array of tables")
    out = []
    for i, b in enumerate(raw):
        bw = f"{where}.bases[{i}]"
        flags = {k: b.get(k) for k in ("applies", "compiles", "tests_pass")}
        bad = [k for k, v in flags.items() if not isinstance(v, bool)]
        if bad:
            raise HarnessError(f"{bw}: '{bad[0]}' must be true or false")
        commit = _str(b, "commit", bw)
        if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
            raise HarnessError(f"{bw}: 'commit' must be 40 lowercase hex digits")
        series = _str(b, "series", bw)
        if series not in SERIES_KINDS:
            raise HarnessError(f"{bw}: series must be one of {', '.join(SERIES_KINDS)}, not {series!r}")
        out.append(BaseCheck(commit=commit, what=_str(b, "what", bw), series=series, command=_str(b, "command", bw),
                             evidence=_str(b, "evidence", bw, required=False), **flags))
    return tuple(out)


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
        patches = []
        raw = table.get("patches", [])
        if not isinstance(raw, list):
            raise HarnessError(f"{where}: 'patches' must be an array of tables")
        for i, p in enumerate(raw):
            pw = f"{where}.patches[{i}]"
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
        upstreams[name] = Upstream(
            name=name,
            clone_url=_str(table, "clone_url", where),
            base=_str(table, "base", where),
            base_ref=_str(table, "base_ref", where),
            base_sha256=_str(table, "base_sha256", where, required=False),
            checked_against=_str(table, "checked_against", where, required=False),
            patches=tuple(patches),
            bases=_bases(table, where),
        )
    return Series(root=root, upstreams=upstreams)
