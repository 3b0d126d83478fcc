"""Pure helpers of the jaxlib build (no I/O beyond reading files): where jax pins XLA, the
build.py and ``bazel test`` command lines, Bazel labels and startup options, and the
fingerprint a stage's stamp records its inputs by."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from xla_harness.errors import HarnessError

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
