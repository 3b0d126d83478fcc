"""The I/O of a ``make xla-test`` run (xla_harness/upstream/xlatest.py): the pinned wheel
downloaded and unpacked, the XLA tree's files copied and patched, objects compiled once per
content, test binaries linked and run, the log's header, and each run's own folder."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.runtime.resources import source_checkout
from xla_harness.upstream.series import Upstream
from xla_harness.upstream.xlatest_gtest import TestResult, parse_gtest, unit_verdict
from xla_harness.upstream.xlatest_plan import (
    BUILD_TIMEOUT_S,
    DOWNLOAD_TIMEOUT_S,
    GIT_TIMEOUT_S,
    GTEST_HEADER,
    GTEST_LIB_DIR,
    GTEST_LIBS,
    SHIM_DIR,
    WHEEL,
    TestUnit,
    Toolchain,
    files_to_copy,
    object_key,
    plan_units,
    support_files_needed,
    touched_files,
    wheel_member_wanted,
)


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


def refuse_local_changes(allow_dirty: bool, what: str) -> None:
    """A run's log records this checkout's commit (``xla-harness <commit>``, tool_versions) and is
    committed as evidence under results/xla/: from a checkout with local changes (``-dirty``) it is
    refused unless ``allow_dirty`` (a run that is not evidence). Installed from a wheel there is
    no checkout, and the log records the version."""
    here = source_checkout()
    if allow_dirty or here is None:
        return
    try:
        res = subproc.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                          capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, HarnessError):
        return  # no git: the log records "unknown", not a dirty commit
    changed = res.stdout.strip().splitlines() if res.returncode == 0 else []
    if changed:
        raise HarnessError(f"{what}: the xla-harness checkout {here} has local changes ({changed[0].strip()}"
                           f"{f' and {len(changed) - 1} more' if len(changed) > 1 else ''}), so the log would "
                           "record xla-harness <commit>-dirty; commit them first, or give --allow-dirty "
                           "(ALLOW_DIRTY=1) for a run that is not evidence")


def describe(xla_src: Path, series_name: str, patches: list[str], wheel_dir: Path, stock: bool,
             sources_from: str = "") -> list[str]:
    from xla_harness.runtime.files import shown

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
