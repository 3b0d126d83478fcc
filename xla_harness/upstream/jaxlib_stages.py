"""The stages of the jaxlib build (resolve, fetch, prepare, bazel, build, install, test),
each ``stage_X(ctx, run) -> outputs``, and the preflight checks made before any of them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.runtime.files import sha256_file
from xla_harness.upstream.apply import apply_patch, git
from xla_harness.upstream.jaxlib_context import DEFAULT_JAX, REPO, Ctx, Runner, _quote
from xla_harness.upstream.jaxlib_plan import (
    PIN_FILES,
    bazel_output_root,
    bazel_startup,
    bazel_test_argv,
    build_argv,
    find_xla_pin,
    undefined_targets,
    xla_label,
)
from xla_harness.upstream.series import Patch, load_series

MAX_DOWNLOAD_BYTES = 2 << 30  # an XLA source tarball is ~100 MB; file:///dev/zero never ends
GIT_TIMEOUT_S = 1800  # `git add -A` / `commit` of a copied XLA tree (tens of thousands of files)


def copy_capped(src, fh, max_bytes: int, url: str, chunk: int = 1 << 20) -> int:
    """Copy a stream into ``fh``, refusing (HarnessError) as soon as it passes ``max_bytes``."""
    total = 0
    while data := src.read(chunk):
        total += len(data)
        if total > max_bytes:
            raise HarnessError(f"fetch: {url} is larger than {max_bytes} bytes; refusing the rest")
        fh.write(data)
    return total


def _download(url: str, dest: Path, max_bytes: int = MAX_DOWNLOAD_BYTES) -> None:
    """Download ``url`` into ``dest``, at most ``max_bytes`` (a partial file is removed)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as fh:
            copy_capped(resp, fh, max_bytes, url)
    except HarnessError:
        dest.unlink(missing_ok=True)
        raise
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise HarnessError(f"fetch: cannot download {url}: {reason} (no network to GitHub?)") from None


def stage_resolve(ctx: Ctx, run: Runner) -> dict:
    src = ctx.work / "src" / ctx.tag
    if ctx.dry_run:
        run(["git", "clone", "--depth", "1", "--branch", ctx.tag, ctx.jax_repo, str(src)], None, "resolve")
        print(f"  [resolve] read the XLA commit and sha256 from the first of {', '.join(PIN_FILES)} "
              f"in {src} that pins one")
        return {}
    if not (src / ".git").exists():
        partial = src.with_name(src.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        run(["git", "clone", "-q", "--depth", "1", "--branch", ctx.tag, ctx.jax_repo, str(partial)], None,
            "resolve", what=f"git clone of {ctx.jax_repo} at {ctx.tag} (no network, or no such tag?)")
        partial.rename(src)
    commit, sha, rel = find_xla_pin(src, ctx.tag)
    return {"jax_src": str(src), "xla_commit": commit, "xla_sha256": sha, "pin_file": rel}


def stage_fetch(ctx: Ctx, run: Runner) -> dict:
    commit = ctx.out("xla_commit", "<XLA_COMMIT>")
    url = ctx.xla_url.format(commit=commit)
    dest = ctx.work / "src" / f"xla-{commit}"
    if ctx.dry_run:
        print(f"  [fetch] download {url} -> {ctx.work / 'src'}/xla-{commit}.tar.gz, "
              f"verify sha256 == {ctx.out('xla_sha256', '<XLA_SHA256>')}, unpack into {dest}")
        return {}
    if (dest / ".complete").exists():
        return {"xla_src": str(dest)}
    tarball = ctx.work / "src" / f"xla-{commit}.tar.gz"
    tarball.parent.mkdir(parents=True, exist_ok=True)
    if not tarball.exists() or sha256_file(tarball) != ctx.state["xla_sha256"]:
        tmp = tarball.with_suffix(".partial")
        _download(url, tmp)
        got = sha256_file(tmp)
        if got != ctx.state["xla_sha256"]:
            tmp.unlink()
            raise HarnessError(f"fetch: sha256 mismatch for {url}: got {got}, jax pins "
                               f"{ctx.state['xla_sha256']}")
        tmp.rename(tarball)
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(tarball) as tf:
        members = tf.getmembers()
        top = {m.name.split("/", 1)[0] for m in members}
        tf.extractall(partial, filter="data")
    inner = partial / top.pop() if len(top) == 1 else partial
    shutil.rmtree(dest, ignore_errors=True)
    inner.rename(dest) if inner != partial else partial.rename(dest)
    shutil.rmtree(partial, ignore_errors=True)
    (dest / ".complete").write_text(commit)
    return {"xla_src": str(dest)}


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return git(args, cwd, timeout=GIT_TIMEOUT_S)


# What building in a prepared tree leaves behind, so that it does not count as a local change:
# our marker, Bazel's convenience symlinks, the bazelrc files jax's build.py and XLA's
# configure.py write, and what an in-tree `pip install` of the jax tree creates.
BUILD_OUTPUTS = (".xla-harness-prepared", "/bazel-*", "/.jax_configure.bazelrc", "/xla_configure.bazelrc",
                 "/build/lib/", "/build/bdist.*/", "*.egg-info/", "__pycache__/")


def check_clean(tree: Path, stage: str) -> None:
    """A prepared tree holds the series and nothing else: refuse one edited since prepare."""
    res = _git(["status", "--porcelain"], tree)
    if res.returncode != 0:
        raise HarnessError(f"{stage}: {tree} is not a prepared tree (git status failed); delete it to start clean")
    dirty = res.stdout.strip()
    if dirty:
        raise HarnessError(f"{stage}: {tree} has local changes ({dirty.splitlines()[0].strip()}); "
                           "put them into a patch of the series, or delete the tree to start clean")


def prepare_tree(base: Path, tree: Path, patches: list[Path], label: str) -> None:
    """A clean copy of ``base`` at ``tree`` with ``patches`` applied in order (git apply).
    An existing tree is reused only if it is clean (no changes since the series was applied)."""
    if (tree / ".xla-harness-prepared").exists():
        check_clean(tree, "prepare")
        return
    partial = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(base, partial, symlinks=True, ignore=shutil.ignore_patterns(".git", ".complete"))
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=build@xla-harness.invalid", "-c", "user.name=xla-harness", "commit",
                  "-qm", f"base {label}"]):
        res = _git(args, partial)
        if res.returncode != 0:
            raise HarnessError(f"prepare: git {args[0]} failed in {partial}: {res.stderr.strip()}")
    for p in patches:
        try:
            apply_patch(p, partial)
        except HarnessError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise HarnessError(f"prepare: {label}: {exc}") from None
    if patches:
        _git(["add", "-A"], partial)
        _git(["-c", "user.email=build@xla-harness.invalid", "-c", "user.name=xla-harness", "commit", "-qm",
              "series applied"], partial)
    info = partial / ".git" / "info" / "exclude"
    info.parent.mkdir(parents=True, exist_ok=True)
    with open(info, "a") as fh:
        fh.write("".join(f"{pat}\n" for pat in BUILD_OUTPUTS))
    (partial / ".xla-harness-prepared").write_text(label)
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)


BUILT_UPSTREAMS = ("xla", "jax")  # the series a jaxlib build applies (XLA's pinned by the jax tag, and jax's)


def series_for(ctx: Ctx) -> dict[str, tuple[Patch, ...]]:
    """The patches applied to each built upstream for this jax version: the series' own files for
    its base, a variant's files for a variant's base; any other version is one HarnessError."""
    series = load_series()
    return {name: series.upstreams[name].select(ctx.series, ctx.tag)
            for name in BUILT_UPSTREAMS if name in series.upstreams}


def describe_series(ctx: Ctx) -> list[str]:
    """One line per built upstream: which files of which variant the build applies."""
    series = load_series()
    lines = []
    for name, patches in series_for(ctx).items():
        up = series.upstreams[name]
        which = f"variant for {ctx.tag}" if up.variant(ctx.tag) else f"the series' own files ({up.base_ref})"
        lines.append(f"{name} series {ctx.series}, {which}: {', '.join(p.file for p in patches) or 'no patches'}")
    return lines


def check_base_commit(ctx: Ctx, name: str, actual: str) -> None:
    """A variant that records its base's commit is applied to that commit only."""
    variant = load_series().upstreams[name].variant(ctx.tag)
    if variant is not None and variant.commit and actual and actual != variant.commit:
        raise HarnessError(f"prepare: the {name} variant for {ctx.tag} was made for {name} {variant.commit[:12]}, "
                           f"but this build's {name} is {actual[:12]}; the variant does not apply to it")


def stage_prepare(ctx: Ctx, run: Runner) -> dict:
    series = load_series()
    selected = series_for(ctx)
    out = {}
    for name, key, src_key in (("xla", "xla_tree", "xla_src"), ("jax", "jax_tree", "jax_src")):
        patches = [p.path(series.root) for p in selected.get(name, ())]
        fp = series.fingerprint(name, ctx.series, ctx.tag)[:12] if name in selected else "none"
        ident = ctx.out("xla_commit", "<XLA_COMMIT>")[:12] if name == "xla" else ctx.jax_version
        tree = ctx.work / "trees" / f"{name}-{ident}-{fp}"
        if ctx.dry_run:
            print(f"  [prepare] copy {ctx.out(src_key, f'<{name} source>')} -> {tree}; git init; "
                  + ("; ".join(f"git apply {p.relative_to(REPO)}" for p in patches) or "no patches"))
        else:
            if name in selected:
                check_base_commit(ctx, name, ctx.out("xla_commit", "") if name == "xla"
                                  else _git(["rev-parse", "HEAD"], Path(ctx.state[src_key])).stdout.strip())
            prepare_tree(Path(ctx.state[src_key]), tree, patches, f"{name} {ident}")
        out[key] = str(tree)
        out[f"{name}_fingerprint"] = fp
    targets = series_bazel_targets(ctx.series)
    if ctx.dry_run:
        print(f"  [prepare] check that {out['xla_tree']} defines {', '.join(targets) or 'no targets'}")
    elif targets:
        missing = undefined_targets(Path(out["xla_tree"]), targets)
        if missing:
            raise HarnessError(f"prepare: {', '.join(missing)} (series.toml) is not defined in "
                               f"{out['xla_tree']}; the XLA commit pinned by {ctx.tag} predates the target")
    return out


def find_bazelisk(version: str = "") -> list[str] | None:
    """bazelisk (or a bazel that is bazelisk) on PATH, else `npx @bazel/bazelisk`, else None.
    With ``version``, a candidate must run that Bazel version when USE_BAZEL_VERSION asks for it
    (bazelisk does; a plain `bazel` ignores it): HarnessError names each one refused."""
    candidates = [[p] for p in (shutil.which(n) for n in ("bazelisk", "bazel")) if p]
    if shutil.which("npx"):
        candidates.append(["npx", "--yes", "@bazel/bazelisk"])
    if not version:
        return candidates[0] if candidates else None
    refused = []
    for cmd in candidates:
        got = _bazel_reports(cmd, version)
        if got == version:
            return cmd
        refused.append(f"{' '.join(cmd)} runs Bazel {got or '(none: --version failed)'}")
    if not refused:
        return None
    raise HarnessError(f"no Bazel {version} (.bazelversion) available: {'; '.join(refused)}; a plain `bazel` "
                       "ignores .bazelversion: install bazelisk (docs/workbench.md, 'Getting bazelisk')")


NO_BAZELISK = ("bazelisk not found on PATH and npx is missing; install it with "
               "'npm install -g @bazel/bazelisk' or put a bazelisk binary on PATH")


def bazel_version_of(tree: Path) -> str:
    """The Bazel version a source tree pins in .bazelversion ('' when it pins none)."""
    f = tree / ".bazelversion"
    if not f.is_file():
        return ""
    # As bazelisk reads it: the first line that is neither empty nor a comment.
    lines = (ln.strip() for ln in f.read_text(encoding="utf-8", errors="replace").splitlines())
    return next((ln for ln in lines if ln and not ln.startswith("#")), "")


def stage_bazel(ctx: Ctx, run: Runner) -> dict:
    jax_tree = Path(ctx.out("jax_tree", "<jax tree>"))
    version = bazel_version_of(jax_tree) if not ctx.dry_run else f"<{jax_tree}/.bazelversion>"
    try:
        cmd = find_bazelisk("" if ctx.dry_run else version)
    except HarnessError as exc:
        raise HarnessError(f"bazel: {exc}") from None
    if cmd is None:
        raise HarnessError(f"bazel: {NO_BAZELISK}")
    wrapper = ctx.work / "bin" / "bazelisk"
    # The wrapper does not pin a version itself: each stage sets USE_BAZEL_VERSION from the
    # .bazelversion of the tree it builds in (jax's for the wheels, XLA's own for its tests).
    if ctx.dry_run:
        print(f"  [bazel] write {wrapper}: exec {' '.join(cmd)} \"$@\"; the Bazel it runs must report the "
              "version .bazelversion names (a plain bazel of another version is refused)")
    else:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text("#!/bin/sh\nexec " + " ".join(_quote(c) for c in cmd) + ' "$@"\n')
        wrapper.chmod(0o755)
    run([str(wrapper), "--version"], jax_tree, "bazel", env={"USE_BAZEL_VERSION": version},
        what=f"bazelisk --version (Bazel {version or 'default'})")
    if not ctx.dry_run and version:
        got = _bazel_reports([str(wrapper)], version)
        if got != version:
            raise HarnessError(f"bazel: {wrapper} runs Bazel {got or '(unknown version)'}, but "
                               f"{jax_tree}/.bazelversion asks for {version}")
    return {"bazel": str(wrapper), "bazel_version": version}


def _bazel_reports(bazel: list[str], version: str) -> str:
    """The version `bazel --version` reports with USE_BAZEL_VERSION=version ('' when unreadable); bazelisk
    downloads that Bazel first, hence the long timeout."""
    try:
        res = subproc.run([*bazel, "--version"], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "USE_BAZEL_VERSION": version})
    except (OSError, HarnessError):  # not runnable, or hung (its process group killed)
        return ""
    m = re.search(r"^bazel (\S+)", res.stdout, re.M)
    return m.group(1) if m and res.returncode == 0 else ""


MIN_PYTHON = (3, 12)  # jax and jaxlib 0.12.0.1: Requires-Python >= 3.12


# The version as jax's build.py takes it: X.Y, or X.Y-ft for a free-threaded (GIL-disabled) build.
_PYVER_PROBE = ("import sys, sysconfig; ft = '-ft' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''; "
                "print(f'{sys.version_info[0]}.{sys.version_info[1]}{ft}')")


def _python_version(python: str) -> str:
    try:
        out = subproc.run([python, "-c", _PYVER_PROBE], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, HarnessError):  # not runnable, or hung (its process group killed)
        out = ""
    if not re.fullmatch(r"\d+\.\d+(-ft)?", out):
        raise HarnessError(f"cannot run {python} to read its version")
    if tuple(int(x) for x in out.removesuffix("-ft").split(".")) < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        raise HarnessError(f"{python} is Python {out}; building jaxlib {DEFAULT_JAX} needs Python >= {need} "
                           "(--python to choose another interpreter)")
    return out


def check_lock_file(jax_tree: Path, pyver: str) -> None:
    """jax builds with a hermetic Python only for versions it has a requirements lock for."""
    if (jax_tree / "build" / f"requirements_lock_{pyver.replace('.', '_').replace('-', '_')}.txt").is_file():
        return
    have = sorted(re.sub(r"_ft$", "-ft", p.stem.removeprefix("requirements_lock_")).replace("_", ".")
                  for p in (jax_tree / "build").glob("requirements_lock_*.txt"))
    raise HarnessError(f"this jax tag has no build/requirements_lock for Python {pyver}; it builds for "
                       f"{', '.join(have) or 'no Python version'} (--python to choose another interpreter)")


def check_free_disk(path: Path, need_gb: float) -> None:
    probe = path
    while not probe.exists():  # measure the filesystem the path will live on, create nothing
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    if free < need_gb:
        raise HarnessError(f"{probe} has {free:.1f} GiB free; the build needs at least {need_gb:g} GiB "
                           "(--min-free-gb to change)")


def preflight(ctx: Ctx, stages: tuple[str, ...]) -> list[str]:
    """Checks made before any stage starts: Python, bazelisk, free disk. Returns what was
    checked, one line each; raises HarnessError (or, in dry-run, reports) the first failure."""
    lines = []
    need = ctx.min_free_gb * (2 if ctx.cuda else 1)

    def python() -> str:
        return f"Python {_python_version(ctx.python)} at {ctx.python}"

    def bazelisk() -> str:
        cmd = find_bazelisk()
        if cmd is None:
            raise HarnessError(NO_BAZELISK)
        return "bazelisk: " + " ".join(cmd)

    def disk() -> str:
        check_free_disk(bazel_output_root(ctx.work), need)
        return f"free disk for {bazel_output_root(ctx.work)} (Bazel's output root; caches beside it): >= {need:g} GiB"

    checks = [python]
    if {"bazel", "build", "test"} & set(stages):
        checks.append(bazelisk)
    if {"fetch", "prepare", "build"} & set(stages):
        checks.append(disk)
    for check in checks:
        try:
            lines.append(check())
        except HarnessError as exc:
            if not ctx.dry_run:
                raise
            lines.append(f"WARNING, a real run would stop here: {exc}")
    return lines


def stage_build(ctx: Ctx, run: Runner) -> dict:
    pyver = _python_version(ctx.python)
    jax_tree = Path(ctx.out("jax_tree", "<jax tree>"))
    out = ctx.work / "dist" / f"{ctx.out('xla_fingerprint', 'fp')}-{'cuda' if ctx.cuda else 'cpu'}"
    argv = build_argv(ctx.python, Path(ctx.out("xla_tree", "<xla tree>")), pyver,
                      ctx.out("bazel", "<bazelisk>"), ctx.work, ctx.cuda, ctx.cuda_major, out)
    version = ctx.out("bazel_version", "")
    if ctx.dry_run:
        print(f"  [build] check that {ctx.out('xla_tree', '<xla tree>')} and {jax_tree} have no local changes")
    else:
        check_lock_file(jax_tree, pyver)
        check_free_disk(bazel_output_root(ctx.work), ctx.min_free_gb * (2 if ctx.cuda else 1))
        shutil.rmtree(out, ignore_errors=True)
    run(argv, jax_tree, "build", env={"USE_BAZEL_VERSION": version}, what="jax build/build.py")
    if not ctx.dry_run and not list(out.glob("*.whl")):
        raise HarnessError(f"build: jax build/build.py succeeded but wrote no wheel to {out}; see {ctx.log('build')}")
    return {"dist": str(out)}


# jax's own runtime requirements, read from the installed patched jax (jaxlib is already there).
_JAX_DEPS = ("import importlib.metadata as m; print('\\n'.join(r for r in m.requires('jax') or [] "
             "if 'extra ==' not in r and not r.startswith('jaxlib')))")


# Written into .venv-patched as the install stage's last step: a venv without it is incomplete.
VENV_COMPLETE = ".xla-harness-complete"


def stage_install(ctx: Ctx, run: Runner) -> dict:
    """.venv-patched, created at its final path (a venv's scripts name the interpreter by absolute
    path, so a venv renamed after the fact is broken); its stamp is written last."""
    venv = ctx.venv
    dist = Path(ctx.out("dist", "<dist>"))
    wheels = sorted(str(w) for w in dist.glob("*.whl")) if not ctx.dry_run else [f"{dist}/*.whl"]
    if not ctx.dry_run and not wheels:
        raise HarnessError(f"install: no wheels in {dist}; the build stage produced nothing")
    if ctx.dry_run:
        print(f"  [install] rm -rf {venv}")
    else:
        shutil.rmtree(venv, ignore_errors=True)
    py = str(venv / "bin" / "python")
    run([ctx.python, "-m", "venv", str(venv)], REPO, "install")
    pip = [py, "-m", "pip", "install", "-q"]
    run([*pip, *wheels], REPO, "install", what="pip install of the built wheels")
    # --no-deps: the self-built jaxlib is a dev version that the pin's `jaxlib<=X` does not admit.
    run([*pip, "--no-deps", ctx.out("jax_tree", "<jax tree>")], REPO, "install", what="pip install of patched jax")
    reqs = ctx.work / "logs" / "jax-requirements.txt"
    if ctx.dry_run:
        print(f"  [install] {py} -c <list jax's requirements without jaxlib> > {reqs}")
    else:
        res = subproc.run([py, "-c", _JAX_DEPS], capture_output=True, text=True, timeout=300,
                          what="install: reading the patched jax's requirements")
        if res.returncode != 0:
            raise HarnessError(f"install: cannot read the patched jax's requirements: {res.stderr.strip()[-200:]}")
        reqs.parent.mkdir(parents=True, exist_ok=True)
        reqs.write_text(res.stdout)
    run([*pip, "-r", str(reqs)], REPO, "install", what="pip install of jax's requirements")
    run([*pip, "-e", f"{REPO}[dev]"], REPO, "install", what="pip install of xla-harness")
    if ctx.dry_run:
        print(f"  [install] write {venv / VENV_COMPLETE}")
    else:
        (venv / VENV_COMPLETE).write_text(ctx.out("xla_fingerprint", "") + "\n")
    return {"venv": str(venv)}


class TestsFailed(Exception):
    """The test stage ran everything and at least one part failed (exit 1: a problem was found)."""


def series_bazel_targets(series_name: str) -> list[str]:
    series = load_series()
    if "xla" not in series.upstreams:
        return []
    return sorted({t for p in series.upstream("xla").select(series_name) for t in p.bazel_targets})


def stage_test(ctx: Ctx, run: Runner) -> dict:
    """XLA's unit tests (bazel test in the jax tree), this project's tests and a short stress matrix
    against .venv-patched. Each part runs whatever the others gave; all results are reported."""
    targets = series_bazel_targets(ctx.series)
    jax_tree = Path(ctx.out("jax_tree", "<jax tree>"))
    results: list[tuple[str, int]] = []
    if targets:
        pyver = _python_version(ctx.python)
        argv = bazel_test_argv(ctx.out("bazel", "<bazelisk>"), bazel_startup(ctx.work), targets, pyver)
        what = "bazel test " + " ".join(xla_label(t) for t in targets)
        rc = run(argv, jax_tree, "test", env={"USE_BAZEL_VERSION": ctx.out("bazel_version", "")}, what=what,
                 check=False)
        results.append((what, rc))
    py = str(Path(ctx.out("venv", str(ctx.venv))) / "bin" / "python")
    rc = run([py, "-m", "pytest", "-q", *ctx.harness_tests], REPO, "test", what="harness tests", check=False)
    results.append(("harness tests", rc))
    out = ctx.results / f"{ctx.series}-{'cuda' if ctx.cuda else 'cpu'}-{ctx.out('xla_fingerprint', 'fp')}"
    if not ctx.dry_run:
        shutil.rmtree(out, ignore_errors=True)
    rc = run([py, "-m", "xla_harness.cli", "stress", "--steps", str(ctx.stress_steps), "--seeds", "1,2", "--quiet",
              "--out", str(out)], REPO, "test", what="stress matrix", check=False)
    results.append(("stress matrix", rc))
    if ctx.dry_run:
        print("  [test] each of these runs whatever the others gave; each result is printed; a failure: exit 1")
        return {}
    for what, rc in results:
        print(f"test: {what}: {'passed' if rc == 0 else f'FAILED (exit {rc})'}")
    if any(rc != 0 for _, rc in results):
        raise TestsFailed(f"test: {sum(rc != 0 for _, rc in results)} of {len(results)} parts failed; "
                          f"see {ctx.log('test')} and {out}")
    return {"results": str(out), "bazel_targets": targets}


RUN = {"resolve": stage_resolve, "fetch": stage_fetch, "prepare": stage_prepare, "bazel": stage_bazel,
       "build": stage_build, "install": stage_install, "test": stage_test}
