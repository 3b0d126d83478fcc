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


# The modules no test file is named after and no test imports by name (each tested through another
# way in): the file that tests it, and what that file says or runs to do it. Held to the files, so a
# moved test or a new module without tests fails here instead of going unseen.
TESTED_THROUGH = {
    "__main__": ("tests/cli/test_startup_signals.py", '"-m", "xla_harness"'),
    "pytest_plugin": ("tests/cli/test_pytest_plugin.py", "xla_harness_stress"),
    "gradcheck.frameworks.jax_adapter": ("tests/gradcheck/test_gradcheck.py", "check.run("),
    "hlo.fusion_decisions": ("tests/hlo/test_hlo.py", '["fusion_decisions"]'),
    "hlo.memplan.dataflow": ("tests/hlo/memplan/test_memcheck.py", "check_texts"),
    "hlo.memplan.liveness": ("tests/hlo/memplan/test_memcheck.py", "check_texts"),
    "hlo.memplan.report": ("tests/hlo/memplan/test_memcheck.py", "check_texts"),
    "hlo.memplan.values": ("tests/hlo/memplan/test_memcheck.py", "check_texts"),
    "hlo.memplan.liverange": ("tests/hlo/memplan/test_memcheck_real.py", '"live-range"'),
    "origin.known": ("tests/origin/test_classify.py", "known"),
    "repro.probe": ("tests/repro/test_bisect.py", "probes"),
    "stress.device.copies": ("tests/stress/test_stress_costs.py", '"copy_tree"'),
    "stress.device.leaves": ("tests/stress/device/test_step_rows.py", "all_finite_by_shape"),
    "stress.distributed": ("tests/stress/test_multihost.py", "jax.distributed"),
    "stress.loop.steps": ("tests/stress/test_stress.py", 'protocol="frozen"'),
    "stress.report.plot": ("tests/cli/test_cli_stress.py", '"--plot"'),
    "stress.results.sink": ("tests/stress/results/test_store.py", "ResultsSink"),
    "triage.child_ends": ("tests/triage/test_fork_interrupts.py", "killed"),
    "triage.next_steps": ("tests/triage/test_triage_where.py", "ans.next_steps"),
    "upstream.apply": ("tests/upstream/test_patchcheck_empty.py", "xla_harness.upstream.patchcheck"),
}


def _imported_by_tests() -> set[str]:
    """Every xla_harness module a test file imports by name (``from a.b import c`` counts for a.b.c)."""
    out = set()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("xla_harness"):
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("xla_harness"))
    return {m.removeprefix("xla_harness.") for m in out}


def _cli_names_tested() -> set[str]:
    """The subcommands the CLI's tests run (each command module's tests are the CLI's)."""
    text = "".join(p.read_text(encoding="utf-8") for folder in ("cli", "commands")
                   for p in (TESTS / folder).glob("*.py"))
    return {m.group(1) for m in re.finditer(r'"([a-z][a-z-]+)"', text)}


def unfound(modules: list[str], named: set[str], imported: set[str], commands: set[str],
            through: dict[str, tuple[str, str]]) -> list[str]:
    """The modules whose tests cannot be found by name: no ``test_<module>*.py`` in their folder of
    tests/ (``named``), no test importing them, not a command the CLI's tests run, not indexed."""
    out = []
    for m in modules:
        if m in named or m in imported or m in through:
            continue
        if m.startswith("commands.") and m.split(".")[1].replace("_", "-") in commands:
            continue
        out.append(m)
    return out


def _named() -> set[str]:
    out = set()
    for name, ispkg in _modules():
        if ispkg:
            continue
        *folder, stem = name.split(".")
        if list(TESTS.joinpath(*folder).glob(f"test_{stem}*.py")):
            out.add(name)
    return out


def test_every_modules_tests_are_found_by_name():
    modules = [name for name, ispkg in _modules() if not ispkg]
    named, imported, commands = _named(), _imported_by_tests(), _cli_names_tested()
    assert unfound(modules, named, imported, commands, TESTED_THROUGH) == []
    stale = [m for m in TESTED_THROUGH if m in named or m in imported or m not in modules]
    assert stale == [], f"found by name now, or gone: drop from TESTED_THROUGH: {stale}"
    for module, (path, says) in TESTED_THROUGH.items():
        assert says in (ROOT / path).read_text(encoding="utf-8"), f"{module}: {path} does not say {says!r}"
    planted = unfound(["stress.loop.planted", "commands.planted_cmd"], named, imported, commands, TESTED_THROUGH)
    assert planted == ["stress.loop.planted", "commands.planted_cmd"]
