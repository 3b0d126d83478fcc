"""Build hook only; the metadata lives in pyproject.toml.

The wheel carries the top-level ``patches/`` tree (series.toml, xla/guards.toml, every
.patch, the READMEs) as ``xla_harness/_data/patches`` so that ``patches-check``, ``pr`` and
the xla-test guards work from an installed wheel; git keeps a single copy, at the top level.
The sdist lists ``patches/`` among build_py's sources, so a wheel built from the sdist has it
too. An editable install reads ``patches/`` in place (xla_harness/runtime/resources.py).

setuptools builds under out/setuptools-build (git-ignored), not its default build/, which
in this project is a tracked folder (build/build_jaxlib.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

HERE = Path(__file__).resolve().parent
PATCHES = "patches"
TARGET = ("xla_harness", "_data", "patches")
BUILD_BASE = HERE / "out" / "setuptools-build"


def _patch_files() -> list[str]:
    """Every file under patches/, relative to the project root, sorted (sources of the copy)."""
    root = HERE / PATCHES
    if not (root / "series.toml").is_file():
        raise SystemExit(f"setup.py: {root}/series.toml is missing; the wheel needs the patch series")
    return sorted(p.relative_to(HERE).as_posix() for p in root.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


class build_py(_build_py):  # noqa: N801 - setuptools looks commands up by this name
    """build_py that also copies patches/ into the package as xla_harness/_data/patches."""

    def run(self) -> None:
        editable = getattr(self, "editable_mode", False)
        if not editable and Path(self.build_lib).resolve() != HERE:  # nothing left from an earlier build
            shutil.rmtree(os.path.join(self.build_lib, TARGET[0]), ignore_errors=True)
        super().run()
        if editable:
            return  # an editable install reads patches/ from the checkout itself
        target = os.path.join(self.build_lib, *TARGET)
        for rel in _patch_files():
            dest = os.path.join(target, os.path.relpath(rel, PATCHES))
            self.mkpath(os.path.dirname(dest))
            self.copy_file(os.path.join(HERE, rel), dest, preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return outputs + [os.path.join(self.build_lib, *TARGET, os.path.relpath(rel, PATCHES))
                          for rel in _patch_files()]

    def get_source_files(self) -> list[str]:
        return super().get_source_files() + _patch_files()


setup(cmdclass={"build_py": build_py}, options={"build": {"build_base": str(BUILD_BASE)}})
