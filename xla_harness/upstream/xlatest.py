"""Compile and run XLA's own unit tests for the patch series without Bazel.

Method: the files the series touches (and, for each patched ``.cc``, its header and its
upstream ``*_test.cc``) are copied from an XLA source tree, the series is applied to the
copy, and only those files are compiled with g++. Everything else (the HLO parser, the
verifier, ShapeUtil, the rest of XLA) comes from the prebuilt XLA inside a pinned
tf-nightly wheel: its ``include/`` tree and ``libtensorflow_framework.so.2``. The
patched definitions interpose the wheel's copies at link time. gtest/gmock come from the
system (Debian: ``libgtest-dev libgmock-dev``); a small stand-in for XLA's
hardware-independent test base lives in ``xlatest_shim/`` (the wheel lacks it).

So a run tests *the patched source files* on top of *the wheel's XLA*; the two should be
close in time, and the output says which is which.

Pure planning (what to copy, compile, link; guards to delete; parsing gtest output) is
separate from the I/O at the bottom of this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from xla_harness import subproc
from xla_harness.errors import HarnessError
from xla_harness.resources import patches_dir, source_checkout
from xla_harness.upstream.patchcheck import parse_patch
from xla_harness.upstream.prefusion import module_patterns, prefusion_modules
from xla_harness.upstream.series import Series, Upstream, load_series

SHIM_DIR = Path(__file__).resolve().parent / "xlatest_shim"
GUARDS_FILE = patches_dir() / "xla" / "guards.toml"


# ----------------------------------------------------------------------------- the pinned wheel


@dataclass(frozen=True)
class WheelPin:
    name: str
    version: str
    python: str
    platform: str

    @property
    def filename(self) -> str:
        tag = "cp" + self.python.replace(".", "")
        return f"{self.name.replace('-', '_')}-{self.version}-{tag}-{tag}-{self.platform}.whl"

    @property
    def label(self) -> str:
        return f"{self.name}=={self.version}"

    def download_argv(self, python: str, dest: Path) -> list[str]:
        return [python, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                "--python-version", self.python, "--only-binary=:all:", "--platform", self.platform,
                "-d", str(dest), self.label]


WHEEL = WheelPin("tf-nightly", "2.23.0.dev20261026", "3.12", "manylinux_2_27_x86_64")
WHEEL_MEMBERS = ("tensorflow/include/", "tensorflow/libtensorflow_framework.so.2")
GTEST_HEADER = Path("/usr/include/gtest/gtest.h")
# How long each child may run before its process group is killed (one error line naming it).
DOWNLOAD_TIMEOUT_S = 3600  # pip download of the wheel, about 650 MB
BUILD_TIMEOUT_S = 1800  # one g++ compile or link; one test binary or probe run
GIT_TIMEOUT_S = 300
GTEST_LIB_DIR = Path("/usr/lib/x86_64-linux-gnu")
GTEST_LIBS = ("libgmock.a", "libgtest_main.a", "libgtest.a")
CXX_FLAGS = ("-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DEIGEN_MAX_ALIGN_BYTES=64",
             "-DABSL_DEFINE_UNQUALIFIED_STATUS_MACROS", "-O1", "-w")
# Test-only XLA files the wheel does not ship: taken from the XLA source tree when the
# wheel lacks them (headers) and compiled alongside the test (.cc).
SUPPORT_FILES = ("xla/hlo/utils/hlo_matchers.h", "xla/hlo/utils/hlo_matchers.cc",
                 "xla/tsl/platform/status_macros.h")


def wheel_member_wanted(name: str) -> bool:
    return any(name.startswith(m) if m.endswith("/") else name == m for m in WHEEL_MEMBERS)


# ----------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class TestUnit:
    """One test binary: a patched source file, its header and its upstream test."""

    source: str  # xla/service/instruction_fusion.cc
    header: str  # xla/service/instruction_fusion.h
    test: str  # xla/service/instruction_fusion_test.cc

    @property
    def name(self) -> str:
        return Path(self.test).stem


def touched_files(patch_texts: Iterable[str]) -> list[str]:
    out: list[str] = []
    for text in patch_texts:
        for h in parse_patch(text):
            if h.file not in out:
                out.append(h.file)
    return out


def plan_units(touched: Iterable[str]) -> list[TestUnit]:
    """A unit per touched non-test .cc; a touched test whose source is untouched still runs."""
    units: dict[str, TestUnit] = {}
    for f in touched:
        if not f.endswith(".cc"):
            continue
        source = f.removesuffix("_test.cc") + ".cc" if f.endswith("_test.cc") else f
        stem = source.removesuffix(".cc")
        units.setdefault(source, TestUnit(source, stem + ".h", stem + "_test.cc"))
    return list(units.values())


def files_to_copy(units: Iterable[TestUnit], touched: Iterable[str]) -> list[str]:
    out: list[str] = []
    for f in [*touched, *(x for u in units for x in (u.source, u.header, u.test))]:
        if f not in out:
            out.append(f)
    return out


def source_files_needed(patch_texts: Iterable[str]) -> list[str]:
    """Every file of an XLA tree that a run of these patches may read: what they touch, the
    header and upstream test of each patched .cc, and the test-only support files (a partial
    ``XLA_SRC`` needs them all; the support files only where the wheel lacks them, and
    ``status_macros.h`` exists only at older bases)."""
    touched = touched_files(patch_texts)
    return files_to_copy(plan_units(touched), touched) + [f for f in SUPPORT_FILES if f not in touched]


def support_files_needed(wheel_has: Callable[[str], bool]) -> list[str]:
    """Support files to take from the XLA tree: headers only where the wheel lacks them; the
    .cc of a header taken from the tree (its objects are not in the wheel either)."""
    headers = [f for f in SUPPORT_FILES if f.endswith(".h") and not wheel_has(f)]
    sources = [f for f in SUPPORT_FILES if f.endswith(".cc") and f.removesuffix(".cc") + ".h" in headers]
    return headers + sources


@dataclass(frozen=True)
class Toolchain:
    cxx: str
    tree: Path  # the patched copy: first on the include path
    wheel_include: Path
    wheel_lib_dir: Path

    def include_dirs(self) -> list[Path]:
        w = self.wheel_include
        return [self.tree, SHIM_DIR, w, w / "external" / "highwayhash", w / "external" / "farmhash_archive" / "src"]

    def compile_argv(self, source: Path, obj: Path) -> list[str]:
        return ["nice", "-n", "10", self.cxx, *CXX_FLAGS, "-c",
                *(f"-I{d}" for d in self.include_dirs()), str(source), "-o", str(obj)]

    def link_argv(self, objs: Iterable[Path], out: Path, gtest_dir: Path = GTEST_LIB_DIR) -> list[str]:
        return ["nice", "-n", "10", self.cxx, "-o", str(out), *(str(o) for o in objs),
                *(str(gtest_dir / lib) for lib in GTEST_LIBS), f"-L{self.wheel_lib_dir}",
                "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{self.wheel_lib_dir}", "-lpthread"]


def object_key(argv: list[str], source_text: bytes, header_texts: Iterable[bytes]) -> str:
    """Cache key of an object file: compiler argv, the source and every header that can differ
    between runs (the patched tree's and the shim's); the wheel is pinned."""
    h = hashlib.sha256()
    h.update("\0".join(a for a in argv if not a.endswith(".o")).encode())
    h.update(b"\0" + source_text)
    for t in header_texts:
        h.update(b"\0" + t)
    return h.hexdigest()[:24]


# ----------------------------------------------------------------------------- gtest output

_GTEST_LINE = re.compile(r"^\[\s+(RUN|OK|FAILED|SKIPPED)\s+\] (\S+?\.\S+?)(?: \(\d+ ms\))?$", re.M)


@dataclass(frozen=True)
class TestResult:
    name: str
    status: str  # "passed" | "failed" | "skipped" | "crashed"


def parse_gtest(output: str) -> list[TestResult]:
    """Per-test results from a gtest run's output. A test that started and never finished
    (the binary died in it) is "crashed"; the summary's repeated FAILED lines are ignored."""
    seen: dict[str, str] = {}
    mapping = {"RUN": "crashed", "OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}
    for status, name in _GTEST_LINE.findall(output):
        if status == "RUN" or seen.get(name) == "crashed":
            seen[name] = mapping[status]
    return [TestResult(n, s) for n, s in seen.items()]


def unit_verdict(results: list[TestResult], returncode: int) -> str:
    if not results:
        return "crashed" if returncode else "no tests"
    if any(r.status == "crashed" for r in results) or (returncode < 0 and not results):
        return "crashed"
    if any(r.status == "failed" for r in results) or returncode != 0:
        return "failed"
    return "passed"


# ----------------------------------------------------------------------------- guards / mutants


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


# ----------------------------------------------------------------------------- blast radius

PROBE_SOURCE = Path(__file__).resolve().parent / "xlatest_tools" / "fusion_decisions.cc"


@dataclass(frozen=True)
class BlastRadius:
    modules: int  # module files read
    modules_with_pairs: int  # modules with at least one in-place candidate pair
    pairs: int  # (producer, in-place consumer) pairs evaluated
    changed: tuple[tuple[str, str, str, str, str], ...]  # (module, consumer, producer, stock, patched)


def parse_decisions(output: str) -> dict[tuple[str, str, str], str]:
    """Lines "file<TAB>consumer<TAB>producer<TAB>allow|forbid" from the probe."""
    out: dict[tuple[str, str, str], str] = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[3] in ("allow", "forbid"):
            out[(parts[0], parts[1], parts[2])] = parts[3]
    return out


def refused_modules(stderr: str) -> list[tuple[str, str]]:
    """(file, why) of each module the probe could not read or parse (its stderr lines
    "unreadable|unparsable<TAB>file[<TAB>parser message]")."""
    out = []
    for line in stderr.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0] in ("unreadable", "unparsable"):
            out.append((parts[1], parts[2] if len(parts) > 2 else parts[0]))
    return out


def compare_decisions(stock_output: str, patched_output: str, modules: int) -> BlastRadius:
    stock, patched = parse_decisions(stock_output), parse_decisions(patched_output)
    if set(stock) != set(patched):
        raise HarnessError("the stock and patched probes evaluated different pairs; the runs are not comparable")
    changed = tuple(sorted((Path(f).name, c, p, stock[(f, c, p)], patched[(f, c, p)])
                           for (f, c, p) in stock if stock[(f, c, p)] != patched[(f, c, p)]))
    return BlastRadius(modules, len({f for f, _, _ in stock}), len(stock), changed)


# ----------------------------------------------------------------------------- I/O


def cache_dir() -> Path:
    return Path(os.environ.get("XLA_HARNESS_CACHE", Path.home() / ".cache" / "xla-harness"))


def ensure_wheel(cache: Path, python: str = sys.executable) -> Path:
    """Download (once) and unpack the pinned wheel's include/ and framework library."""
    root = cache / f"{WHEEL.name}-{WHEEL.version}"
    done = root / ".unpacked"
    if done.is_file():
        return root / "tensorflow"
    wheels = cache / "wheels"
    whl = wheels / WHEEL.filename
    if not whl.is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        print(f"xla-test: downloading {WHEEL.label} (about 650 MB, once) into {wheels}", flush=True)
        res = subproc.run(WHEEL.download_argv(python, wheels), capture_output=True, text=True,
                          timeout=DOWNLOAD_TIMEOUT_S, what=f"downloading {WHEEL.label}")
        if res.returncode != 0 or not whl.is_file():
            last = (res.stderr.strip().splitlines() or ["no wheel file"])[-1]
            raise HarnessError(f"could not download {WHEEL.label}: {last}")
    print(f"xla-test: unpacking include/ and libtensorflow_framework.so.2 from {whl.name}", flush=True)
    try:
        with zipfile.ZipFile(whl) as z:
            z.extractall(root, [n for n in z.namelist() if wheel_member_wanted(n)])
    except (OSError, zipfile.BadZipFile) as exc:
        raise HarnessError(f"cannot unpack {whl}: {exc}") from None
    done.write_text(WHEEL.label + "\n")
    return root / "tensorflow"


def check_toolchain(cxx: str) -> None:
    if shutil.which(cxx) is None:
        raise HarnessError(f"{cxx} is not installed; xla-test needs a C++17 compiler (apt-get install g++)")
    missing = [str(GTEST_LIB_DIR / lib) for lib in GTEST_LIBS if not (GTEST_LIB_DIR / lib).is_file()]
    if not GTEST_HEADER.is_file() or missing:
        raise HarnessError("gtest/gmock are not installed (need /usr/include/gtest and "
                           f"{', '.join(GTEST_LIBS)}); run: apt-get install -y libgtest-dev libgmock-dev")


def source_commit(xla_src: Path) -> str:
    """The XLA commit of the source tree: a git checkout's HEAD or an XLA_COMMIT file."""
    marker = xla_src / "XLA_COMMIT"
    if marker.is_file():
        return marker.read_text().strip()
    if (xla_src / ".git").exists():
        try:
            res = subproc.run(["git", "-C", str(xla_src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
        except (OSError, HarnessError):
            return "unknown"
        if res.returncode == 0:
            return res.stdout.strip()
    return "unknown"


def base_ref_for(up: Upstream, commit: str, asked: str = "") -> str | None:
    """Which of the series' bases a run is for: ``asked`` (BASE_REF=) if given, else the variant
    recorded for the tree's commit, else None (the series' own files). A variant that records its
    commit is refused for a tree at another known commit: it was not made for that base."""
    if asked:
        variant = up.variant(asked)  # an unknown base is one error naming the known ones
        if variant is not None and variant.commit and commit != "unknown" and commit != variant.commit:
            raise HarnessError(f"the xla series for {asked} was made for XLA {variant.commit[:12]}, but the "
                               f"tree is at {commit[:12]}")
        return None if variant is None else asked
    for v in up.variants:
        if v.commit and v.commit == commit:
            return v.base_ref
    return None


def _git_apply(tree: Path, patch: Path) -> None:
    res = subproc.run(["git", "apply", str(patch)], cwd=tree, capture_output=True, text=True,
                      timeout=GIT_TIMEOUT_S, what=f"git apply {patch.name}")
    if res.returncode != 0:
        first = (res.stderr.strip().splitlines() or ["git apply failed"])[0]
        raise HarnessError(f"{patch.name} does not apply to the given XLA tree: {first.removeprefix('error: ')}")


def prepare_tree(xla_src: Path, patch_paths: list[Path], dest: Path, wheel_include: Path,
                 stock_sources: bool = False, sources_from: Path | None = None) -> tuple[list[TestUnit], list[str]]:
    """Copy what is needed from ``xla_src`` into ``dest`` and apply the patches there.
    With ``stock_sources`` the patched non-test sources are put back to their stock text
    (patched tests over stock code: shows which new tests need the patch); with
    ``sources_from`` they are taken from that folder instead (the tests over another version
    of the change, e.g. an earlier one)."""
    texts = [p.read_text(encoding="utf-8") for p in patch_paths]
    touched = touched_files(texts)
    units = plan_units(touched)
    if not units:
        raise HarnessError("the selected patches touch no .cc file: nothing to compile")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    support = support_files_needed(lambda f: (wheel_include / f).is_file())
    for rel in files_to_copy(units, touched) + support:
        src = xla_src / rel
        if not src.is_file():
            if rel in support:
                continue
            raise HarnessError(f"{rel} is not in the XLA tree {xla_src}")
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / rel)
    for p in patch_paths:
        _git_apply(dest, p)
    if stock_sources:
        for u in units:
            shutil.copyfile(xla_src / u.source, dest / u.source)
    if sources_from is not None:
        for u in units:
            if not (sources_from / u.source).is_file():
                raise HarnessError(f"{u.source} is not in the --sources-from folder {sources_from}")
            shutil.copyfile(sources_from / u.source, dest / u.source)
    return units, [f for f in support if f.endswith(".cc") and (dest / f).is_file()]


def _headers(dirs: Iterable[Path]) -> list[bytes]:
    return [p.read_bytes() for d in dirs for p in sorted(d.rglob("*.h"))]


def compile_cached(tc: Toolchain, source: Path, obj_dir: Path, log: Callable[[str], None]) -> Path:
    """Compile ``source`` once per content: the key names the run's folder (the tree's parent)
    by a placeholder, so runs in different folders share objects; each run writes its own
    temporary file and renames it into place, so concurrent runs never see half an object."""
    obj_dir.mkdir(parents=True, exist_ok=True)
    run_root = str(tc.tree.parent)
    probe = [a.replace(run_root, "<run>") for a in tc.compile_argv(source, Path("x.o"))]
    key = object_key(probe, source.read_bytes(), _headers([tc.tree, SHIM_DIR]))
    obj = obj_dir / f"{source.stem}-{key}.o"
    if obj.is_file():
        log(f"  cached  {source.name} ({obj.name})")
        return obj
    log(f"  g++ -c  {source.name}")
    tmp = obj.with_name(f"{obj.stem}.{os.getpid()}.tmp.o")
    res = subproc.run(tc.compile_argv(source, tmp), capture_output=True, text=True,
                      timeout=BUILD_TIMEOUT_S, what=f"g++ -c {source.name}")
    if res.returncode != 0:
        errors = [ln for ln in res.stderr.splitlines() if "error" in ln][:20]
        log("\n".join(errors))
        raise HarnessError(f"{source.name} does not compile against {WHEEL.label}'s headers "
                           f"(first error: {errors[0] if errors else res.stderr.strip()[:200]})")
    tmp.rename(obj)
    return obj


@dataclass
class UnitRun:
    unit: TestUnit
    results: list[TestResult]
    returncode: int
    output: str

    @property
    def verdict(self) -> str:
        return unit_verdict(self.results, self.returncode)


def build_and_run(tc: Toolchain, unit: TestUnit, support_cc: list[str], work: Path,
                  log: Callable[[str], None], gtest_filter: str = "") -> UnitRun:
    objs = [compile_cached(tc, tc.tree / f, work / "obj", log) for f in (unit.test, unit.source, *support_cc)]
    exe = work / "bin" / unit.name
    exe.parent.mkdir(parents=True, exist_ok=True)
    res = subproc.run(tc.link_argv(objs, exe), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                      what=f"linking {unit.name}")
    if res.returncode != 0:
        raise HarnessError(f"linking {unit.name} failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    argv = [str(exe)] + ([f"--gtest_filter={gtest_filter}"] if gtest_filter else [])
    run = subproc.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, what=f"the test {unit.name}")
    out = run.stdout + run.stderr
    return UnitRun(unit, parse_gtest(out), run.returncode, out)


def _first_line(argv: list[str]) -> str:
    try:
        res = subproc.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, HarnessError):
        return "unknown"
    return (res.stdout.strip().splitlines() or ["unknown"])[0]


def tool_versions(cxx: str) -> str:
    """Compiler, gtest package and this repository's commit, for the log's header."""
    gtest = _first_line(["dpkg-query", "-W", "-f=${Version}", "libgtest-dev"])
    from xla_harness import __version__

    here = source_checkout()  # a wheel has no commit of its own: its version instead
    repo = (_first_line(["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=12"])
            if here is not None else __version__)
    return f"{_first_line([cxx, '--version'])}; libgtest-dev {gtest}; xla-harness {repo}"


def describe(xla_src: Path, series_name: str, patches: list[str], wheel_dir: Path, stock: bool,
             sources_from: str = "") -> list[str]:
    from xla_harness.files import shown

    return [shown(line) for line in [
        f"wheel XLA (everything not listed below): {WHEEL.label}, {wheel_dir}/include and "
        f"libtensorflow_framework.so.2",
        f"patched source: {xla_src} at XLA commit {source_commit(xla_src)}, series {series_name}: "
        + (", ".join(patches) or "(none)"),
        "compiled from that source: the files the series touches, their headers and upstream tests"
        + (" (non-test sources kept STOCK: patched tests over stock code)" if stock else "")
        + (f" (non-test sources taken from {sources_from}: the patched tests over them)" if sources_from else ""),
        "not run on GPU; tests are XLA's hardware-independent unit tests",
        "tools: " + tool_versions("g++"),
    ]]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_run_dir(work: Path) -> Path:
    """A folder of this run's own under ``work/runs`` (patched tree, binaries, stock copies), so
    two runs on one machine never share or delete each other's tree; ``work/obj`` (objects keyed
    by content) is shared through a link. Folders left by runs whose process is gone are removed."""
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for old in runs.iterdir():
        pid = old.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    run = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=runs))
    (work / "obj").mkdir(parents=True, exist_ok=True)
    (run / "obj").symlink_to(work / "obj", target_is_directory=True)
    return run


def _setup(args: argparse.Namespace, series: Series) -> tuple[Toolchain, list, list[TestUnit], list[str], Path]:
    xla_src = Path(args.xla_src)
    if not xla_src.is_dir():
        raise HarnessError(f"XLA_SRC {xla_src} is not a directory")
    check_toolchain(args.cxx)
    patches = list(series.upstream("xla").select(args.series, args.base_ref))
    wheel = ensure_wheel(Path(args.cache))
    work = new_run_dir(Path(args.cache) / "xla-test")
    args.run_dir = work  # removed by main() when the command ends
    tree = work / "tree"
    sources_from = getattr(args, "sources_from", "")
    units, support_cc = prepare_tree(xla_src, [p.path(series.root) for p in patches], tree,
                                     wheel / "include", stock_sources=getattr(args, "stock_sources", False),
                                     sources_from=Path(sources_from) if sources_from else None)
    tc = Toolchain(args.cxx, tree, wheel / "include", wheel)
    return tc, patches, units, support_cc, work


def _resolve_base(args: argparse.Namespace, series: Series) -> None:
    """args.base_ref becomes the base the run is for (None: the series' own), and is printed."""
    up = series.upstream("xla")
    args.base_ref = base_ref_for(up, source_commit(Path(args.xla_src)), args.base_ref)
    which = (f"its variant for {args.base_ref}" if args.base_ref else f"the series' own files ({up.base_ref})")
    how = " (recorded for the tree's XLA commit)" if args.base_ref and not args.asked_base_ref else ""
    print(f"xla-{args.command}: series for the base: {which}{how}")


def cmd_files(args: argparse.Namespace) -> int:
    series = load_series()
    texts = [p.path(series.root).read_text(encoding="utf-8")
             for p in series.upstream("xla").select(args.series, args.base_ref or None)]
    for f in source_files_needed(texts):
        print(f)
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    if args.stock_sources and args.sources_from:
        raise HarnessError("give --stock-sources (STOCK=1) or --sources-from (SOURCES_FROM=dir), not both")
    if not args.xla_src:
        print("xla-test: not checked: no XLA_SRC")
        return 0
    series = load_series()
    _resolve_base(args, series)
    tc, patches, units, support_cc, work = _setup(args, series)
    for line in describe(Path(args.xla_src), args.series, [p.file for p in patches], tc.wheel_lib_dir,
                         args.stock_sources, args.sources_from):
        print("xla-test: " + line)
    if not units:
        raise HarnessError(f"series {args.series!r} patches no XLA source with a unit test: nothing to run")
    worst = 0
    empty = []
    for unit in units:
        print(f"== {unit.test} (with {unit.source})", flush=True)
        run = build_and_run(tc, unit, support_cc, work, lambda s: print(s, flush=True), args.filter)
        for r in run.results:
            print(f"  {r.status.upper():7} {r.name}")
        n_fail = sum(r.status == "failed" for r in run.results)
        print(f"== {unit.name}: {run.verdict}: {len(run.results)} tests, {n_fail} failed (exit {run.returncode})")
        if run.verdict == "crashed":
            print(run.output[-3000:])
        if run.verdict == "no tests":
            empty.append(unit.name)
        worst = max(worst, 0 if run.verdict == "passed" else 1)
    if empty:  # a binary that ran no test checked nothing: not a pass, not a finding
        filt = f" (--filter {args.filter!r})" if args.filter else ""
        print(f"error: xla-test: no test ran in {', '.join(empty)}{filt}", file=sys.stderr)
        return 2
    return worst


def unit_for(units: Iterable[TestUnit], source: str, what: str) -> TestUnit:
    """The unit test compiled with ``source``; a clear error (not StopIteration) when there is none."""
    for unit in units:
        if unit.source == source:
            return unit
    raise HarnessError(f"{what}: no unit test is built with {source} (each guarded file needs its *_test.cc "
                       "in the tree); nothing to run the mutant against")


def cmd_mutants(args: argparse.Namespace) -> int:
    if not args.xla_src:
        print("xla-mutants: not checked: no XLA_SRC")
        return 0
    series = load_series()
    args.series = "default"
    _resolve_base(args, series)
    guards, absent = guards_for_base(load_guards(), series.upstream("xla"), args.base_ref)
    patches = [p.file for p in series.upstream("xla").select("default", args.base_ref)]
    uncovered = check_guards_cover(guards, patches)
    if uncovered:
        raise HarnessError(f"no guards listed for {', '.join(uncovered)} in patches/xla/guards.toml")
    tc, _, units, support_cc, work = _setup(args, series)
    for line in describe(Path(args.xla_src), "default", patches, tc.wheel_lib_dir, False):
        print("xla-mutants: " + line)
    if absent:  # listed, not skipped in silence: the guarded code does not exist at this base
        print(f"xla-mutants: {len(absent)} guards of the series have no counterpart at {args.base_ref} "
              "(patches/xla/guards.toml says why); not mutated:")
        for g, why in absent:
            print(f"  absent  {g.name}: {why}")
    pristine = {f: (tc.tree / f).read_text() for f in {g.file for g in guards}}
    rows = []
    for g in guards:
        if g.patch not in patches:
            continue
        unit = unit_for(units, g.file, f"guard {g.name} of {g.patch}")
        (tc.tree / g.file).write_text(mutate(pristine[g.file], g))
        try:
            print(f"== mutant: {g.patch} / {g.name}", flush=True)
            run = build_and_run(tc, unit, support_cc, work, lambda s: print(s, flush=True))
        finally:
            (tc.tree / g.file).write_text(pristine[g.file])
        failing = [r.name for r in run.results if r.status in ("failed", "crashed")]
        killed = bool(failing) or run.verdict == "crashed"
        rows.append((g.patch.split("/")[-1][:4], g.name, "killed" if killed else "SURVIVED",
                     ", ".join(failing) or ("crashed" if killed else "-")))
    print("\n| patch | guard deleted | verdict | failing tests |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if not rows:
        raise HarnessError("no guard of the default series' patches was mutated: nothing checked")
    survivors = sum(r[2] == "SURVIVED" for r in rows)
    print(f"xla-mutants: {len(rows)} mutants, {len(rows) - survivors} killed, {survivors} survived"
          + (f"; {len(absent)} guards absent at this base (listed above)" if absent else ""))
    return 1 if survivors else 0


def cmd_blast(args: argparse.Namespace) -> int:
    if not args.xla_src:
        print("xla-blast-radius: not checked: no XLA_SRC")
        return 0
    modules = prefusion_modules(Path(args.modules))
    if not modules:
        raise HarnessError(f"no pre-fusion modules ({module_patterns()}) under {args.modules} "
                           "(make them with python -m xla_harness.upstream.prefusion --out DIR [--target T])")
    series = load_series()
    args.series = "default"
    _resolve_base(args, series)
    tc, patches, units, _, work = _setup(args, series)
    unit = next((u for u in units if u.source == "xla/service/instruction_fusion.cc"), None)
    if unit is None:
        raise HarnessError("the default series does not patch xla/service/instruction_fusion.cc")
    for line in describe(Path(args.xla_src), "default", [p.file for p in patches], tc.wheel_lib_dir, False):
        print("xla-blast-radius: " + line)
    if args.sources_from:
        print(f"xla-blast-radius: the patched side is {unit.source} from {args.sources_from}, not the series")
    log = lambda s: print(s, flush=True)  # noqa: E731
    stock_dir = work / "stock" / Path(unit.source).parent
    stock_dir.mkdir(parents=True, exist_ok=True)
    stock_src = stock_dir / Path(unit.source).name
    shutil.copyfile(Path(args.xla_src) / unit.source, stock_src)
    probe = compile_cached(tc, PROBE_SOURCE, work / "obj", log)
    outputs: dict[str, str] = {}
    refused: dict[str, list[tuple[str, str]]] = {}
    for label, src in (("stock", stock_src), ("patched", tc.tree / unit.source)):
        obj = compile_cached(tc, src, work / "obj", log)
        exe = work / "bin" / f"fusion_decisions_{label}"
        exe.parent.mkdir(parents=True, exist_ok=True)
        res = subproc.run(tc.link_argv([probe, obj], exe), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          what=f"linking the {label} probe")
        if res.returncode != 0:
            raise HarnessError(f"linking the {label} probe failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
        run = subproc.run([str(exe), *map(str, modules)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          what=f"the {label} probe")
        if run.returncode not in (0, 2):
            raise HarnessError(f"the {label} probe died (exit {run.returncode})")
        outputs[label] = run.stdout
        refused[label] = refused_modules(run.stderr)
    if refused["stock"] != refused["patched"]:
        raise HarnessError("the stock and patched probes refused different modules; the runs are not comparable")
    radius = compare_decisions(outputs["stock"], outputs["patched"], len(modules) - len(refused["stock"]))
    print(f"xla-blast-radius: {len(modules)} pre-fusion modules from {args.modules}, "
          f"{len(refused['stock'])} the wheel's parser refused, {radius.modules} read, "
          f"{radius.modules_with_pairs} with in-place candidate pairs, {radius.pairs} pairs evaluated, "
          f"{len(radius.changed)} decisions changed")
    for row in radius.changed:
        print("  changed: " + "  ".join(row))
    for file, why in refused["stock"]:
        print(f"  refused: {Path(file).name}  {why[:300]}")
    return 1 if refused["stock"] else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m xla_harness.upstream.xlatest", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_text in (("test", "compile and run the patched XLA unit tests"),
                            ("mutants", "delete each guard of each default patch; every mutant must fail a test"),
                            ("blast-radius", "count fusion decisions the default series changes over HLO modules")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--xla-src", default="", help="XLA source tree (checkout or partial copy)")
        p.add_argument("--cache", default=str(cache_dir()), help="download/build cache")
        p.add_argument("--cxx", default="g++", help="C++ compiler")
        p.add_argument("--base-ref", default="", help="the base the XLA tree is, as series.toml names it "
                       "(e.g. jax-v0.9.0.1): its variant's files; default: the variant recorded for the "
                       "tree's XLA commit, else the series' own files")
        if name == "test":
            p.add_argument("--series", default="default", help="default | experimental")
        if name in ("test", "blast-radius"):
            p.add_argument("--sources-from", default="", metavar="DIR",
                           help="take the patched non-test sources from DIR (same relative paths) instead "
                                "(blast-radius: the decisions of that source against stock)")
        if name == "test":
            p.add_argument("--stock-sources", action="store_true",
                           help="keep the non-test sources stock (patched tests over stock code)")
            p.add_argument("--filter", default="", help="gtest filter")
        if name == "blast-radius":
            p.add_argument("--modules", default="",
                           help=f"folder of pre-fusion modules ({module_patterns()}; searched recursively)")
    files = sub.add_parser("files", help="print the XLA files a partial XLA_SRC needs for a series (for git archive)")
    files.add_argument("--series", default="default", help="default | experimental")
    files.add_argument("--base-ref", default="", help="the base (e.g. jax-v0.9.0.1): its variant's files")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.asked_base_ref = args.base_ref
    try:
        commands = {"test": cmd_test, "mutants": cmd_mutants, "blast-radius": cmd_blast, "files": cmd_files}
        return commands[args.command](args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        run_dir = getattr(args, "run_dir", None)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
