"""Pure planning of a ``make xla-test`` run (xla_harness/upstream/xlatest.py): the pinned
tf-nightly wheel whose prebuilt XLA the patched files link against, which files of an XLA tree
a series needs and which test binaries it makes, and the g++ command lines (the toolchain).
No I/O here; xlatest_build.py does it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from xla_harness.upstream.patchcheck import parse_patch

SHIM_DIR = Path(__file__).resolve().parent / "xlatest_shim"


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
