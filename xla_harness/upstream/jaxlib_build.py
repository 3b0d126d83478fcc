#!/usr/bin/env python3
"""Build jaxlib (and the CUDA plugin) from source with this project's patch series.

Stages, each idempotent and resumable; each writes a log and, on success, a stamp that
records its inputs under WORK/ (default ~/.cache/xla-harness, or $XLA_HARNESS_WORK):

  resolve  jax version -> tag jax-v<version> -> XLA commit and sha256 from that tag's
           third_party/xla/revision.bzl (older tags: workspace.bzl; the oldest: WORKSPACE);
           the jax tag is cloned shallow into WORK/src/jax-<tag> (cached)
  fetch    XLA at that commit: the GitHub tarball, verified against the sha256 jax pins,
           unpacked into WORK/src/xla-<commit> (cached by commit)
  prepare  clean work trees per (commit, series fingerprint): WORK/trees/xla-<c>-<fp> and
           WORK/trees/jax-<version>-<fp> with the series applied by `git apply`
  bazel    find bazelisk (PATH, else `npx @bazel/bazelisk`); each later Bazel call gets
           USE_BAZEL_VERSION from the .bazelversion of the tree it runs in
  build    jax's own build/build.py build --wheels=jaxlib[,jax-cuda-plugin,jax-cuda-pjrt]
           --local_xla_path=<patched xla> --python_version=X.Y [--cuda_major_version=N]
           with a Bazel disk cache and repository cache under WORK (via --bazel_options)
  install  .venv-patched: the built wheels + the patched jax and its requirements + this package
  test     in the jax tree, `bazel test @xla//<target>` of the targets the series touches
           (series.toml) with the build's Bazel, output base, hermetic Python and toolchain;
           then, whatever that gave, this project's tests and a short stress matrix against
           .venv-patched (results/patched/); each part's result is printed, and any failure
           makes the exit status 1

Before any stage starts: Python >= 3.12, bazelisk (when a Bazel stage is selected) and free
disk (--min-free-gb, doubled with --cuda) are checked.
A stage is skipped when its stamp matches its current inputs; a stage whose inputs changed
is redone, and so are the stages after it. --dry-run prints every stage's exact commands
and touches nothing. Errors (no network, sha256 mismatch, a patch that does not apply,
bazelisk missing, Python too old, too little free disk) are one `error:` line and exit 2;
a stage killed midway leaves no stamp, and the next run redoes it from a clean state.

The TPU compiler lives in libtpu and is not rebuilt by any of this.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.files import sha256_file
from xla_harness.upstream.apply import apply_patch
from xla_harness.upstream.series import load_series

REPO = Path(__file__).resolve().parents[2]

STAGES = ("resolve", "fetch", "prepare", "bazel", "build", "install", "test")
DEFAULT_JAX = "0.12.0.1"
JAX_REPO = "https://github.com/jax-ml/jax.git"
XLA_TARBALL = "https://github.com/openxla/xla/archive/{commit}.tar.gz"
MIN_FREE_GB = 40  # a jaxlib build with its bazel caches; CUDA needs more (see --min-free-gb)


# ----------------------------------------------------------------------------- pure helpers

_COMMIT = re.compile(r'^\s*XLA_COMMIT\s*=\s*"([0-9a-f]{7,40})"', re.M)
_SHA = re.compile(r'^\s*XLA_SHA256\s*=\s*"([0-9a-f]{64})"', re.M)
# jax before third_party/xla/workspace.bzl (<= 0.4.14): an http_archive named "xla" in WORKSPACE
# with the sha256 and strip_prefix = "xla-<commit>" written inline.
_INLINE = re.compile(r'name\s*=\s*"xla"(?P<body>[^)]*)\)', re.S)
_INLINE_SHA = re.compile(r'sha256\s*=\s*"([0-9a-f]{64})"')
_INLINE_COMMIT = re.compile(r'strip_prefix\s*=\s*"xla-([0-9a-f]{7,40})"')
# Where jax has kept the XLA pin, newest layout first.
PIN_FILES = ("third_party/xla/revision.bzl", "third_party/xla/workspace.bzl", "WORKSPACE")


def parse_xla_pin(text: str, name: str = "revision.bzl") -> tuple[str, str]:
    """(XLA commit, XLA sha256) from jax's revision.bzl, an older workspace.bzl (both with
    XLA_COMMIT/XLA_SHA256 assignments) or the oldest layout, an inline http_archive in WORKSPACE."""
    c, s = _COMMIT.search(text), _SHA.search(text)
    if c and s:
        return c.group(1), s.group(1)
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    m = _INLINE.search(code)
    if m:
        ic, isha = _INLINE_COMMIT.search(m.group("body")), _INLINE_SHA.search(m.group("body"))
        if ic and isha:
            return ic.group(1), isha.group(1)
    raise HarnessError(f"{name}: no XLA_COMMIT/XLA_SHA256 assignments found")


def find_xla_pin(jax_src: Path, tag: str) -> tuple[str, str, str]:
    """(commit, sha256, file) from the first pin file of ``jax_src`` that carries the pin."""
    for rel in PIN_FILES:
        f = jax_src / rel
        if not f.is_file():
            continue
        try:
            commit, sha = parse_xla_pin(f.read_text(encoding="utf-8"), f"{tag}:{rel}")
        except HarnessError:
            continue  # e.g. workspace.bzl that only load()s revision.bzl
        return commit, sha, rel
    raise HarnessError(f"resolve: {tag} pins no XLA commit in any of {', '.join(PIN_FILES)}")


def jax_tag(version: str) -> str:
    if not re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", version):
        raise HarnessError(f"not a jax release version: {version!r}")
    return f"jax-v{version}"


def wheels_for(cuda: bool) -> list[str]:
    return ["jaxlib", "jax-cuda-plugin", "jax-cuda-pjrt"] if cuda else ["jaxlib"]


def build_argv(python: str, xla_tree: Path, python_version: str, bazel: str, work: Path,
               cuda: bool, cuda_major: str, out: Path) -> list[str]:
    """The build.py command line (flag names as in jax's build/build.py 'build' subcommand)."""
    argv = [python, "build/build.py", "build", f"--wheels={','.join(wheels_for(cuda))}",
            f"--local_xla_path={xla_tree}", f"--python_version={python_version}",
            f"--bazel_path={bazel}",
            *(f"--bazel_startup_options={o}" for o in bazel_startup(work)),
            f"--bazel_options=--disk_cache={work / 'bazel-disk-cache'}",
            f"--bazel_options=--repository_cache={work / 'bazel-repo-cache'}",
            f"--output_path={out}"]
    if cuda:
        argv.append(f"--cuda_major_version={cuda_major}")
    return argv


def bazel_test_argv(bazel: str, startup: list[str], targets: list[str], python_version: str) -> list[str]:
    """bazel test of XLA targets from inside the jax tree: the same workspace, startup options (so the
    same output base), hermetic Python and toolchain as the wheel build. The caches, the hermetic clang
    config and --override_repository=xla=<patched tree> come from the .jax_configure.bazelrc that jax's
    build.py wrote as `build` lines, which `test` inherits."""
    return [bazel, *startup, "test", *hermetic_python_flags(python_version), "--verbose_failures=true",
            "--test_output=errors", *(xla_label(t) for t in targets)]


def xla_label(target: str) -> str:
    """An XLA target as seen from the jax workspace: //xla/x:y -> @xla//xla/x:y."""
    return target if target.startswith("@") else "@xla" + target


def hermetic_python_flags(python_version: str) -> list[str]:
    """What jax's build.py puts on its Bazel command line for --python_version (not in its bazelrc)."""
    flags = [f"--repo_env=HERMETIC_PYTHON_VERSION={python_version}"]
    if python_version.endswith("-ft"):
        flags.append('--@rules_python//python/config_settings:py_freethreaded="yes"')
    return flags


def bazel_startup(work: Path) -> list[str]:
    """Bazel startup options of every Bazel call of the pipeline (the build and the tests): the
    output root (output bases, external repositories, the hermetic toolchains) lives in the work
    dir, on the filesystem the free-disk check measures, and both calls share it."""
    return [f"--output_user_root={bazel_output_root(work)}"]


def bazel_output_root(work: Path) -> Path:
    return work / "bazel-root"


_LABEL = re.compile(r"^//(?P<pkg>[\w./+-]*)(?::(?P<name>[\w./+-]+))?$")


def undefined_targets(tree: Path, targets: list[str]) -> list[str]:
    """The labels among ``targets`` that no rule in ``tree``'s BUILD / BUILD.bazel files defines
    (a `name = "..."` attribute in the package's BUILD file, comments ignored)."""
    missing = []
    for label in targets:
        m = _LABEL.match(label)
        pkg = m.group("pkg") if m else ""
        name = (m.group("name") or pkg.rsplit("/", 1)[-1]) if m else ""
        text = ""
        for build in ("BUILD", "BUILD.bazel"):
            f = tree / pkg / build
            if m and f.is_file():
                text = f.read_text(encoding="utf-8", errors="replace")
                break
        code = "\n".join(ln.split("#", 1)[0] for ln in text.splitlines())
        if not name or not re.search(rf'\bname\s*=\s*"{re.escape(name)}"', code):
            missing.append(label)
    return missing



def fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- context


@dataclass
class Ctx:
    work: Path
    jax_version: str
    series: str = "default"
    cuda: bool = False
    cuda_major: str = "12"
    python: str = sys.executable
    jax_repo: str = JAX_REPO
    xla_url: str = XLA_TARBALL
    dry_run: bool = False
    min_free_gb: float = MIN_FREE_GB
    venv: Path = REPO / ".venv-patched"
    results: Path = REPO / "results" / "patched"
    harness_tests: tuple[str, ...] = ("tests/test_hlo.py", "tests/test_stress.py")
    stress_steps: int = 10
    state: dict = field(default_factory=dict)  # outputs of earlier stages

    @property
    def tag(self) -> str:
        return jax_tag(self.jax_version)

    def log(self, stage: str) -> Path:
        return self.work / "logs" / f"{stage}.log"

    def stamp(self, stage: str) -> Path:
        return self.work / "stamps" / f"{stage}.json"

    def out(self, key: str, placeholder: str) -> str:
        return str(self.state.get(key, placeholder))


class Runner:
    """Runs argv lists with output to a stage log; in dry-run prints them instead."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def __call__(self, argv: list[str], cwd: Path | None, stage: str, env: dict | None = None,
                 what: str = "", check: bool = True) -> int:
        """Run ``argv``; returns its exit status (0 in a dry run). With ``check`` a failure raises."""
        shown = " ".join(_quote(a) for a in argv)
        env = env or {}
        if env:
            shown = "env " + " ".join(f"{k}={_quote(v)}" if v else f"-u {k}" for k, v in env.items()) + " " + shown
        if self.ctx.dry_run:
            print(f"  [{stage}] (cd {cwd or '.'} && {shown})")
            return 0
        log = self.ctx.log(stage)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ (cd {cwd} && {shown})\n")
            fh.flush()
            try:
                full = {**os.environ, **env}
                for k in [k for k, v in env.items() if not v]:  # an empty value means: unset it
                    full.pop(k)
                res = subprocess.run(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=full)
            except FileNotFoundError:
                raise HarnessError(f"{stage}: {argv[0]} not found") from None
        if res.returncode != 0 and check:
            raise HarnessError(f"{stage}: {what or argv[0]} failed (exit {res.returncode}); see {log}")
        return res.returncode


def _quote(a: str) -> str:
    return a if re.fullmatch(r"[\w@%+=:,./\-]+", a) else "'" + a.replace("'", "'\\''") + "'"


# ----------------------------------------------------------------------------- stages


def _download(url: str, dest: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as fh:
            shutil.copyfileobj(resp, fh)
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
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


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


def stage_prepare(ctx: Ctx, run: Runner) -> dict:
    series = load_series()
    out = {}
    for name, key, src_key in (("xla", "xla_tree", "xla_src"), ("jax", "jax_tree", "jax_src")):
        up = series.upstreams.get(name)
        patches = [p.path(series.root) for p in up.select(ctx.series)] if up else []
        fp = series.fingerprint(name, ctx.series)[:12] if up else "none"
        ident = ctx.out("xla_commit", "<XLA_COMMIT>")[:12] if name == "xla" else ctx.jax_version
        tree = ctx.work / "trees" / f"{name}-{ident}-{fp}"
        if ctx.dry_run:
            print(f"  [prepare] copy {ctx.out(src_key, f'<{name} source>')} -> {tree}; git init; "
                  + ("; ".join(f"git apply {p.relative_to(REPO)}" for p in patches) or "no patches"))
        else:
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
                       "ignores .bazelversion: install bazelisk (README, 'Getting bazelisk')")


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
        res = subprocess.run([*bazel, "--version"], capture_output=True, text=True, timeout=1800,
                             env={**os.environ, "USE_BAZEL_VERSION": version})
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"^bazel (\S+)", res.stdout, re.M)
    return m.group(1) if m and res.returncode == 0 else ""


MIN_PYTHON = (3, 12)  # jax and jaxlib 0.12.0.1: Requires-Python >= 3.12


# The version as jax's build.py takes it: X.Y, or X.Y-ft for a free-threaded (GIL-disabled) build.
_PYVER_PROBE = ("import sys, sysconfig; ft = '-ft' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''; "
                "print(f'{sys.version_info[0]}.{sys.version_info[1]}{ft}')")


def _python_version(python: str) -> str:
    try:
        out = subprocess.run([python, "-c", _PYVER_PROBE], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
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
        res = subprocess.run([py, "-c", _JAX_DEPS], capture_output=True, text=True)
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


def stage_inputs(ctx: Ctx, stage: str) -> dict:
    """What a stage depends on: its options plus everything earlier stages produced."""
    base = {"stage": stage, "state": dict(ctx.state)}
    if stage == "resolve":
        base.update(jax_version=ctx.jax_version, jax_repo=ctx.jax_repo)
    elif stage == "fetch":
        base.update(xla_url=ctx.xla_url)
    elif stage == "prepare":
        series = load_series()
        base.update(series=ctx.series, fingerprints={n: series.fingerprint(n, ctx.series)
                                                     for n in series.upstreams})
    elif stage == "build":
        base.update(cuda=ctx.cuda, cuda_major=ctx.cuda_major, python=ctx.python)
    elif stage == "install":
        base.update(venv=str(ctx.venv))
    elif stage == "test":
        base.update(tests=list(ctx.harness_tests), steps=ctx.stress_steps, results=str(ctx.results))
    return base


# Stage outputs that name paths: a stamp whose paths are gone (a deleted tree or venv) is stale.
PATH_OUTPUTS = ("jax_src", "xla_src", "xla_tree", "jax_tree", "bazel", "dist", "venv")


def outputs_present(outputs: dict) -> bool:
    """Every path a stage produced still exists (a venv also carries its completion stamp)."""
    if "venv" in outputs and not (Path(outputs["venv"]) / VENV_COMPLETE).is_file():
        return False
    return all(Path(outputs[k]).exists() for k in PATH_OUTPUTS if k in outputs)


def check_trees_clean(ctx: Ctx, stage: str) -> None:
    """Before every build or bazel test, run or skipped: the trees hold the series and nothing else,
    so neither new wheels nor a stamp's claim about old ones can stand for edited sources."""
    for key in ("xla_tree", "jax_tree"):
        if key in ctx.state:
            check_clean(Path(ctx.state[key]), stage)


def read_stamp(path: Path) -> dict:
    """A stage's stamp ({"inputs": ..., "outputs": {...}}); a corrupt one is an error naming it."""
    from xla_harness.files import read_regular

    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("outputs"), dict):
        raise HarnessError(f"{path} is not a stage stamp of this pipeline; delete it to run that stage again")
    return data


def check_options(ctx: Ctx) -> None:
    """Option values that would otherwise fail only after hours of building."""
    if not math.isfinite(ctx.min_free_gb) or ctx.min_free_gb < 0:
        raise HarnessError(f"--min-free-gb must be a non-negative number, got {ctx.min_free_gb}")
    if ctx.stress_steps <= 0:
        raise HarnessError(f"--stress-steps must be a positive integer, got {ctx.stress_steps}")
    if not ctx.harness_tests:
        raise HarnessError("--harness-tests lists no test file")
    if ctx.work.exists() and not ctx.work.is_dir():
        raise HarnessError(f"--work-dir {ctx.work} is not a folder")


def run_pipeline(ctx: Ctx, first: str = "resolve", last: str = "test") -> list[tuple[str, str]]:
    """Run stages first..last; returns (stage, 'done'|'skipped'|'planned') per stage."""
    i, j = STAGES.index(first), STAGES.index(last)
    if i > j:
        raise HarnessError(f"--from {first} comes after --to {last}")
    report = []
    run = Runner(ctx)
    # Outputs of stages before --from come from their stamps.
    for stage in STAGES[:i]:
        st = ctx.stamp(stage)
        if st.exists():
            ctx.state.update(read_stamp(st)["outputs"])
        elif not ctx.dry_run:
            raise HarnessError(f"--from {first}: stage {stage} has not run yet (no stamp in {st.parent})")
    redo = False
    for stage in STAGES[i:j + 1]:
        if stage in ("build", "test") and not ctx.dry_run:
            check_trees_clean(ctx, stage)
        inputs = fingerprint(stage_inputs(ctx, stage))
        st = ctx.stamp(stage)
        if not redo and st.exists():
            data = read_stamp(st)
            if data.get("inputs") == inputs and outputs_present(data.get("outputs", {})):
                ctx.state.update(data["outputs"])
                report.append((stage, "skipped"))
                if ctx.dry_run:
                    print(f"{stage}: up to date (stamp {st})")
                continue
        redo = True  # every later stage depends on this one's outputs
        if ctx.dry_run:
            print(f"{stage}:")
            ctx.state.update(RUN[stage](ctx, run))
            report.append((stage, "planned"))
            continue
        sys.stderr.write(f"[{stage}] running (log: {ctx.log(stage)})\n")
        st.unlink(missing_ok=True)
        outputs = RUN[stage](ctx, run)
        ctx.state.update(outputs)
        st.parent.mkdir(parents=True, exist_ok=True)
        tmp = st.with_suffix(".tmp")
        tmp.write_text(json.dumps({"inputs": inputs, "outputs": outputs}, indent=2))
        tmp.replace(st)
        report.append((stage, "done"))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="build_jaxlib.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jax-version", default=DEFAULT_JAX, help=f"jax release to build (default {DEFAULT_JAX})")
    ap.add_argument("--series", choices=["default", "experimental"], default="default",
                    help="patch series: default, or default + experimental (A/B runs)")
    ap.add_argument("--cuda", action="store_true", help="also build jax-cuda-plugin and jax-cuda-pjrt")
    ap.add_argument("--cuda-major", default="12", choices=["12", "13"],
                    help="CUDA major version of the GPU wheels: jax's --cuda_major_version, which selects "
                         "--config=cuda<N> and its hermetic CUDA/cuDNN (default 12, as in jax's build.py)")
    ap.add_argument("--python", default=sys.executable, help="Python to build for and install into")
    ap.add_argument("--work-dir", type=Path,
                    default=Path(os.environ.get("XLA_HARNESS_WORK", Path.home() / ".cache" / "xla-harness")),
                    help="work dir for sources, trees, caches, logs and stamps")
    ap.add_argument("--jax-repo", default=JAX_REPO, help="jax git repository to clone the tag from")
    ap.add_argument("--xla-url", default=XLA_TARBALL, help="XLA tarball URL template with {commit}")
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-patched", help="venv to install into")
    ap.add_argument("--from", dest="first", choices=STAGES, default="resolve", help="first stage to run")
    ap.add_argument("--to", dest="last", choices=STAGES, default="test", help="last stage to run")
    ap.add_argument("--min-free-gb", type=float, default=MIN_FREE_GB, help="free disk required to build")
    ap.add_argument("--dry-run", action="store_true", help="print every stage's commands, touch nothing")
    ap.add_argument("--results", type=Path, default=REPO / "results" / "patched",
                    help="where the test stage writes its stress results")
    ap.add_argument("--harness-tests", default="tests/test_hlo.py,tests/test_stress.py",
                    help="comma-separated test files the test stage runs against the venv")
    ap.add_argument("--stress-steps", type=int, default=10, help="steps of the test stage's stress matrix")

    def _error(message: str) -> None:
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(2)

    ap.error = _error  # type: ignore[method-assign]
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    ctx = Ctx(work=args.work_dir.expanduser(), jax_version=args.jax_version, series=args.series,
              cuda=args.cuda, cuda_major=args.cuda_major, python=args.python, jax_repo=args.jax_repo,
              xla_url=args.xla_url, dry_run=args.dry_run, min_free_gb=args.min_free_gb, venv=args.venv,
              results=args.results, harness_tests=tuple(t for t in args.harness_tests.split(",") if t),
              stress_steps=args.stress_steps)
    try:
        check_options(ctx)
        jax_tag(ctx.jax_version)
        if ctx.dry_run:
            print(f"plan: jax {ctx.jax_version} ({ctx.tag}), series {ctx.series}, "
                  f"{'CPU + CUDA ' + ctx.cuda_major if ctx.cuda else 'CPU'} wheels, work dir {ctx.work}")
            print("preflight:")
        stages = STAGES[STAGES.index(args.first):STAGES.index(args.last) + 1]
        for line in preflight(ctx, stages):
            if ctx.dry_run:
                print(f"  {line}")
        report = run_pipeline(ctx, args.first, args.last)
    except TestsFailed as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"error: {exc.filename or ''}: {exc.strerror or exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: the current stage left no stamp and will be redone\n")
        return 130
    if not ctx.dry_run:
        for stage, status in report:
            print(f"{stage}: {status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
