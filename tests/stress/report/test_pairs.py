"""Pairwise designs (xla_harness/stress/report/pairs.py) and make tpu-pairs's checks before it compiles."""

import inspect
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_harness.errors import HarnessError
from xla_harness.stress.report import pairs
from xla_harness.stress.report.pairs import ISSUE_35409_FACTORS, lower_bound, missing_pairs, pairwise

ROOT = Path(__file__).resolve().parents[3]
BAD_MODE = "option mode must be one of full, sparse_only, dense_only, got '{}'"  # the option table's line


def uncovered(factors, design):
    """Written apart from missing_pairs: every pair of levels of every two factors, minus those a cell holds."""
    out = []
    for a, b in itertools.combinations(factors, 2):
        for u in factors[a]:
            for v in factors[b]:
                if not any(cell[a] == u and cell[b] == v for cell in design):
                    out.append((a, u, b, v))
    return out


def test_the_35409_design_covers_every_pair_in_the_fewest_cells():
    design = pairwise(ISSUE_35409_FACTORS)
    assert uncovered(ISSUE_35409_FACTORS, design) == [] == missing_pairs(ISSUE_35409_FACTORS, design)
    # The lower bound: embed_spec (5 levels) x jit or precision (3) need 15 cells on their own.
    assert lower_bound(ISSUE_35409_FACTORS) == 15 and len(design) == 15
    assert all(set(cell) == set(ISSUE_35409_FACTORS) for cell in design)
    assert len({tuple(c.values()) for c in design}) == 15  # no cell twice
    assert pairwise(ISSUE_35409_FACTORS) == design  # the same factors give the same design


def test_the_35409_levels_are_the_programs_options_and_the_sweeps_specs():
    from xla_harness.programs import issue_35409, issue_35409_config
    from xla_harness.programs.precision import PRECISIONS

    f = ISSUE_35409_FACTORS
    assert f["jit"] == issue_35409_config.JIT_PLACEMENTS and f["dtype"] == issue_35409_config.DTYPES
    assert f["precision"] == PRECISIONS and f["specs"] == issue_35409_config.SPEC_SETS
    assert f["axis_types"] == issue_35409_config.AXIS_TYPES and f["donate"] == ("True", "False")
    sweep = {p.name.split("=", 1)[1] for p in (ROOT / "results/tpu-aot/sweep").glob("embed_spec=*")}
    assert set(f["embed_spec"]) == sweep | {"model,data"}  # the sweep's specs and the default
    # Every factor's first level is the program's default.
    defaults = {k: p.default for k, p in inspect.signature(issue_35409.make).parameters.items()}
    assert defaults["embed_spec"] == ("model", "data")
    assert {k: "model,data" if k == "embed_spec" else str(defaults[k]) for k in f} == {k: v[0] for k, v in f.items()}


def test_a_missing_pair_is_found():
    design = pairwise(ISSUE_35409_FACTORS)
    for i in range(len(design)):
        short = design[:i] + design[i + 1:]
        assert missing_pairs(ISSUE_35409_FACTORS, short) == uncovered(ISSUE_35409_FACTORS, short) != []
    changed = [dict(c) for c in design]
    changed[0]["precision"] = "bogus"
    with pytest.raises(HarnessError, match="cell 1 gives factor 'precision' the value 'bogus'"):
        missing_pairs(ISSUE_35409_FACTORS, changed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=2, max_size=7))
def test_any_factors_get_a_pairwise_design(counts):
    factors = {f"f{i}": tuple(f"v{j}" for j in range(n)) for i, n in enumerate(counts)}
    design = pairwise(factors, tries=8)
    assert uncovered(factors, design) == []
    assert len(design) >= lower_bound(factors)
    assert len(design) <= 2 * lower_bound(factors) + 4  # greedy, not optimal: near the bound all the same


@pytest.mark.parametrize("factors, says", [({"a": ("x",)}, "at least two factors"),
                                           ({"a": ("x",), "b": ()}, "factor 'b' has no levels"),
                                           ({"a": ("x", "x"), "b": ("y",)}, "factor 'a' lists a level twice")])
def test_bad_factors_are_refused(factors, says):
    with pytest.raises(HarnessError, match=says):
        pairwise(factors)


def test_every_cell_is_checked_against_the_program():
    design = pairwise(ISSUE_35409_FACTORS)
    pairs.check_issue_35409_cells(design, {"mode": "full", "remat": "True"})
    bad = [dict(c) for c in design]
    bad[3]["embed_spec"] = "model,model"
    with pytest.raises(HarnessError,
                       match=r"^pairs cell 4 \(jit=.*\): --program issue-35409: option embed_spec must be two of"):
        pairs.check_issue_35409_cells(bad, {})
    with pytest.raises(HarnessError, match=BAD_MODE.format("tied")):
        pairs.check_issue_35409_cells(design, {"mode": "tied"})
    with pytest.raises(HarnessError, match="takes no option 'width'"):
        pairs.check_issue_35409_cells(design, {"width": "3"})


def _run(argv, env=None):
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_the_module_prints_the_design_and_refuses_bad_input(capsys):
    assert pairs.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [pairs.cell_words(c) for c in pairwise(ISSUE_35409_FACTORS)]
    assert pairs.main(["--summary", "--fixed", "mode=full", "remat=True"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "15 cells; lower bound 15"
    for fixed, says in ((["mode=tied"], BAD_MODE.format("tied")), (["precision=high"], "precision is a factor"),
                        (["remat"], "KEY=VALUE")):
        assert pairs.main(["--fixed", *fixed]) == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and says in err[0] and captured.out == "", err


@pytest.mark.slow
@pytest.mark.parametrize("cells, says", [("full", "is not MODE:REMAT"), ("tied:True", BAD_MODE.format("tied")),
                                         ("full:True bogus:False", BAD_MODE.format("bogus")),
                                         ("", "PAIRS_CELLS is empty")])
def test_tpu_pairs_checks_its_input_before_it_makes_anything(tmp_path, cells, says):
    """A bad cell stops tools/tpu-pairs with one error line before any venv, folder or compile."""
    out = tmp_path / "pairs"
    r = _run(["bash", "tools/tpu-pairs"], env={
        "TPU_TARGET": "tpu:v6e:2x4", "MATRIX_PINS": "0.0.0.0", "PAIRS_CELLS": cells, "PAIRS_OUT": str(out),
        "DEFAULT_JAX_PIN": "0.12.0.1", "VENV": str(Path(sys.executable).parent.parent)})
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("error:") and says in err[0], r.stderr
    assert not out.exists() and not (ROOT / ".venv-jax0.0.0.0").exists() and r.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("script", ["tools/tpu-pairs", "tools/tpu-matrix", "tools/tpu-sweep"])
@pytest.mark.parametrize("pins, says", [("bogus", "'bogus' is not a jax version"),
                                        ("0.12.0.1 0.9.x", "'0.9.x' is not a jax version"),
                                        ("  ", "names no jax version")])
def test_the_tpu_scripts_refuse_a_pin_that_is_no_version_before_making_a_venv(tmp_path, script, pins, says):
    out = tmp_path / "out"
    r = _run(["bash", script], env={
        "TPU_TARGET": "tpu:v6e:2x4", "MATRIX_PINS": pins, "PAIRS_CELLS": "full:True", "PAIRS_OUT": str(out),
        "MATRIX_CELLS": "full:True", "MATRIX_OUT": str(out), "MATRIX_VARIANTS": "", "MATRIX_OPTIONS": "",
        "SWEEP": "dtype=bf16", "SWEEP_CELLS": "full:True", "SWEEP_OUT": str(out), "CHECK_PY": sys.executable,
        "DEFAULT_JAX_PIN": "0.12.0.1", "VENV": str(Path(sys.executable).parent.parent)})
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("error:") and says in err[0], r.stderr
    assert not out.exists() and not list(ROOT.glob(".venv-jaxbogus*")) and not (ROOT / ".venv-jax0.9.x").exists()


@pytest.mark.slow
def test_make_refuses_a_jax_pin_that_is_no_version_before_making_anything():
    r = subprocess.run(["make", "-n", "setup", "JAX_PIN=bogus"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "JAX_PIN=bogus is not a jax version" in r.stderr
    assert not (ROOT / ".venv-jaxbogus").exists()
