"""The import contracts of pyproject.toml's [tool.importlinter] (what `make lint` runs).

In process: the package's import graph keeps every contract, and an import planted in a copy of
that graph breaks the contract meant to catch it. As subprocesses (slow): ``lint-imports`` itself
passes on the tree, and fails on a copy of the package with a violating import written into it.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="not checked: import-linter is not installed (the dev extra; "
                    "make setup installs it)")

import grimp  # noqa: E402  (import-linter's graph builder, installed with it)
from importlinter import configuration  # noqa: E402
from importlinter.adapters.user_options import TomlFileUserOptionReader  # noqa: E402
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract  # noqa: E402
from importlinter.contracts.forbidden import ForbiddenContract  # noqa: E402
from importlinter.contracts.layers import LayersContract  # noqa: E402

configuration.configure()  # what lint-imports does first: its config readers, graph builder, file system

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "xla_harness"
CONTRACT_TYPES = {"layers": LayersContract, "forbidden": ForbiddenContract,
                  "acyclic_siblings": AcyclicSiblingsContract}


def contracts() -> dict:
    """Contract id -> contract object, built from pyproject.toml as lint-imports builds them."""
    options = TomlFileUserOptionReader().read_options(config_filename=str(ROOT / "pyproject.toml"))
    assert options is not None, "pyproject.toml has no [tool.importlinter]"
    assert options.session_options["root_packages"] == [PACKAGE]
    return {c["id"]: CONTRACT_TYPES[c["type"]](name=c["name"], session_options=options.session_options,
                                               contract_options=c)
            for c in options.contracts_options}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None)


def test_config_declares_the_contracts():
    assert set(contracts()) == {"layers", "stress-layers", "core-not-stress", "below-commands", "acyclic"}


@pytest.mark.parametrize("contract_id", ["layers", "stress-layers", "core-not-stress", "below-commands", "acyclic"])
def test_the_package_keeps_each_contract(graph, contract_id):
    check = contracts()[contract_id].check(copy.deepcopy(graph), verbose=False)
    assert check.kept, check.metadata


# (contract id, importer, imported): one violation each contract must catch. Function-level
# imports are edges of the graph like any other (grimp reads every import statement).
PLANTED = [
    pytest.param("core-not-stress", "xla_harness.hlo.tied", "xla_harness.stress.results.records", id="hlo->stress"),
    pytest.param("core-not-stress", "xla_harness.programs.tied_embedding", "xla_harness.stress.results.records",
                 id="programs->stress (the cycle broken by moving label)"),
    pytest.param("core-not-stress", "xla_harness.gradcheck.check", "xla_harness.commands.gradcheck",
                 id="gradcheck->commands"),
    pytest.param("below-commands", "xla_harness.stress.results.records", "xla_harness.cli", id="stress->cli"),
    pytest.param("below-commands", "xla_harness.upstream.pr", "xla_harness.commands.pr", id="upstream->commands"),
    pytest.param("layers", "xla_harness.errors", "xla_harness.runtime.files", id="errors->files (a lower layer)"),
    pytest.param("layers", "xla_harness.hlo.alias", "xla_harness.gradcheck.cases",
                 id="hlo->gradcheck (independent siblings)"),
    pytest.param("layers", "xla_harness.stress.report.summary", "xla_harness.repro.bundle", id="stress->repro"),
    pytest.param("stress-layers", "xla_harness.stress.results.store", "xla_harness.stress.spec",
                 id="results->spec (the store below what it stores)"),
    pytest.param("stress-layers", "xla_harness.stress.device.checker", "xla_harness.stress.proof.harness",
                 id="device->proof (the checks below the configuration that holds them)"),
    pytest.param("stress-layers", "xla_harness.stress.loop.blocks", "xla_harness.stress.runner",
                 id="loop->runner"),
    pytest.param("acyclic", "xla_harness.upstream.patchfile", "xla_harness.upstream.apply",
                 id="patchfile->apply (apply<->patchcheck, broken by patchfile)"),
    pytest.param("acyclic", "xla_harness.gradcheck.frameworks.jax_adapter", "xla_harness.gradcheck.check",
                 id="jax_adapter->check (broken by moving gradient)"),
]


@pytest.mark.parametrize(("contract_id", "importer", "imported"), PLANTED)
def test_a_planted_import_breaks_its_contract(graph, contract_id, importer, imported):
    planted = copy.deepcopy(graph)
    assert importer in planted.modules and imported in planted.modules
    assert not planted.direct_import_exists(importer=importer, imported=imported)
    planted.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    assert not contracts()[contract_id].check(planted, verbose=False).kept


def test_an_undeclared_top_level_module_breaks_the_layers(graph):
    planted = copy.deepcopy(graph)
    planted.add_module(f"{PACKAGE}.planted")
    check = contracts()["layers"].check(planted, verbose=False)
    assert not check.kept


# ----------------------------------------------------------------------------- lint-imports itself


def lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``lint-imports`` in ``cwd`` (it puts its cwd first on sys.path, so the package there is
    the one analysed; its contracts come from ``cwd/pyproject.toml``)."""
    exe = Path(sys.executable).with_name("lint-imports")
    exe = str(exe) if exe.is_file() else shutil.which("lint-imports")
    assert exe, "import-linter is importable but its lint-imports script is not installed"
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "PYTHONPATH": str(cwd)}
    return subprocess.run([exe, "--no-cache", "--no-logo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_lint_imports_passes():
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.slow
def test_lint_imports_fails_on_a_copy_with_a_planted_function_level_import(tmp_path):
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    shutil.copyfile(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    tied = tmp_path / PACKAGE / "hlo" / "tied.py"
    tied.write_text(tied.read_text(encoding="utf-8") + "\n\ndef _planted():\n"
                    "    from xla_harness.stress.results import records  # noqa: F401\n", encoding="utf-8")
    res = lint_imports(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "xla_harness.hlo.tied -> xla_harness.stress.results.records" in out, out
    assert "broken" in out and "0 broken" not in out, out
