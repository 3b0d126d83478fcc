"""tests/ mirrors the package it tests, so a module's tests are found by name.

The tests of ``xla_harness/<package>/`` live in ``tests/<package>/`` (``tests/hlo/memplan`` for
``xla_harness/hlo/memplan``), those of a top-level module ``xla_harness/<module>.py`` at the top as
``tests/test_<module>*.py``, those of the CLI and the other entry points in ``tests/cli``, and the
repository-wide checks (import contracts, lint and type check, wheel, quickstart, census) in
``tests/project``. A test file is named after what it tests, never after when it was written
(``test_i34_records.py``). Not every module has a file of its own: many are tested through others.
"""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path

import xla_harness

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "xla_harness"
ROUND_NAMED = re.compile(r"^test_i\d+_")
ENTRY_POINTS = {"__main__", "cli", "pytest_plugin"}  # tested in tests/cli
# Folders of tests/ that are no package of xla_harness: the entry points, the repository-wide checks,
# data, and the suites run in venvs of their own (make frameworks-test, make patches-jax-check).
OWN_FOLDERS = {"cli", "project", "data", "frameworks", "jaxpatch"}
PATH_LIST = re.compile(r"^tests/test_\w+\.py(,tests/test_\w+\.py)*$")


def _modules() -> list[tuple[str, bool]]:
    """(dotted name below xla_harness, is a package) for every module of the package."""
    return [(m.name.removeprefix("xla_harness."), m.ispkg)
            for m in pkgutil.walk_packages(xla_harness.__path__, "xla_harness.")]


def _named_by_the_package() -> set[str]:
    """The flat test files the package itself names by path (the jaxlib build runs them by default):
    they stay where it looks for them."""
    named = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and PATH_LIST.match(node.value):
                named.update(Path(p).name for p in node.value.split(","))
    return named


def _test_folders() -> list[Path]:
    return sorted({p.parent for p in TESTS.rglob("test_*.py")} - {TESTS})


def test_no_test_file_is_named_after_when_it_was_written():
    assert [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if ROUND_NAMED.match(p.name)] == []


def test_the_flat_test_files_are_those_of_top_level_modules():
    top = {name for name, ispkg in _modules() if "." not in name and not ispkg} - ENTRY_POINTS
    allowed = _named_by_the_package()
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    strays = [n for n in flat if n not in allowed and not any(re.match(rf"test_{m}(_\w+)?\.py$", n) for m in top)]
    assert strays == [], f"move these into the folder of the package they test: {strays}"


def test_each_test_folder_is_a_package_of_xla_harness_or_one_of_its_own():
    packages = {name.replace(".", "/") for name, ispkg in _modules() if ispkg}
    folders = [str(f.relative_to(TESTS)) for f in _test_folders()]
    assert [f for f in folders if f not in packages and f.split("/")[0] not in OWN_FOLDERS] == []


def test_each_test_folder_is_a_python_package():
    """The tests import their helpers package-relatively, and two test files of one basename in two
    folders are two modules only as packages."""
    assert [str(f.relative_to(TESTS)) for f in _test_folders() if not (f / "__init__.py").is_file()] == []
