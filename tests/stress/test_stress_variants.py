"""`stress --variants`: workaround variants as a matrix axis, each compiled separately in the same
run, each row compared with its configuration's baseline (Fisher exact test, loss trajectory)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.stress.report import stats
from xla_harness.stress.report import summary as report
from xla_harness.stress.results import records
from xla_harness.stress.results import store as results
from xla_harness.stress.spec import StressSpec

from ..helpers import FOREIGN_PROGRAM, TINY, TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]
LOSS_RTOL = 1e-5  # variants compute the same function; measured differences are ~1e-7 (see test_variants.py)

@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "variant_model.py"
    path.write_text(FOREIGN_PROGRAM)
    return path


def test_variant_labels_are_distinct_and_known_to_the_records():
    spec = StressSpec(modes=("full", "dense_only"), remats=(True,), seeds=(1,), steps=2,
                      variants=("baseline", "barrier", "xla-no-fusion", "onehot+xla-no-fusion"), **TINY)
    labels = spec.labels()
    assert len(labels) == len(set(labels)) == 8
    assert labels == records.spec_labels(spec.to_dict())  # what report/gaps expect
    assert labels[:2] == ["full/remat=on/f32[variant=baseline]", "full/remat=on/f32[variant=barrier]"]
    user = StressSpec(program="x.py:make", program_options=(("width", 8),), variants=("baseline", "sumgrad"))
    assert user.labels() == records.spec_labels(user.to_dict()) == [
        "x.py:make[variant=baseline,width=8]", "x.py:make[variant=sumgrad,width=8]"]
    # A tuple option is a list once written to the results header: the labels still agree.
    tup = StressSpec(program="x.py:make", program_options=(("layers", (1, 2)),), variants=("baseline", "onehot"))
    assert tup.labels() == records.spec_labels(json.loads(json.dumps(tup.to_dict())))
    # Without variants the spec (and so every label and the header fingerprint) is what it was.
    plain = StressSpec(**TINY)
    assert "variants" not in plain.to_dict()
    assert StressSpec.from_dict(spec.to_dict()) == spec
    assert records.spec_fingerprint(spec.to_dict()) == records.spec_fingerprint(
        StressSpec(modes=("full", "dense_only"), remats=(True,), seeds=(1,), steps=2, **TINY).to_dict())


@pytest.mark.parametrize("variants, needle", [
    (("barrier", "baseline"), "must start with baseline"),
    (("baseline", "bogus"), "unknown variant 'bogus'"),
    (("baseline", "barrier+bogus"), "unknown part 'bogus'"),
    (("baseline", "precision-low"), "precision: precision-high, precision-highest"),
    (("baseline", "Precision-High"), "names are lower case: precision-high"),
    (("baseline", "precision-default"), "the default precision is the baseline's"),
    (("baseline", "barrier", "barrier"), "distinct"),
])
def test_bad_variant_lists_are_refused(variants, needle):
    with pytest.raises(HarnessError, match=needle):
        StressSpec(variants=variants, **TINY)


def test_variants_and_a_variant_program_option_exclude_each_other():
    with pytest.raises(HarnessError, match="exclude each other"):
        StressSpec(program="x.py:make", program_options=(("variant", "barrier"),), variants=("baseline", "onehot"))


def _fps(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("step fingerprint "):
            label, _, rest = line[len("step fingerprint "):].partition(": ")
            out[label] = rest.split()[0]
    return out


@pytest.mark.slow
def test_each_variant_row_is_compared_with_the_baseline(foreign, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["stress", "--program", f"{foreign}:make_variants", "--variants", "baseline,barrier,xla-no-fusion",
               "--seeds", "1,2", "--steps", "40", "--block", "20", "--out", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0
    base, fixed, flags = (f"{foreign}:make_variants[variant={v}]" for v in ("baseline", "barrier", "xla-no-fusion"))
    fps = _fps(text)
    assert list(fps) == [base, fixed, flags]
    # Its "barrier" changes only the batches, so its step compiles as the baseline's; the flag set
    # changes the compile.
    assert fps[base] == fps[fixed] != fps[flags]
    table = report.load_table([out])
    assert not table.gaps
    rows = {r.label: r for r in table.rows}
    assert rows[base].k > 0 and rows[fixed].k == 0 and rows[flags].k == rows[base].k
    vs = report.baseline_comparisons(table)
    assert set(vs) == {fixed, flags}
    assert vs[fixed]["p_value"] == stats.fisher_exact(0, 80, rows[base].k, 80) < 0.05
    assert vs[flags]["p_value"] == pytest.approx(1.0)
    # The flag set compiles the same function: the same loss at every (seed, step) both ran.
    assert vs[flags]["compared_steps"] == 80 - rows[base].k
    assert vs[flags]["max_loss_rel_diff"] <= LOSS_RTOL
    line = next(ln for ln in text.splitlines() if ln.startswith(fixed))
    assert f"p={vs[fixed]['p_value']:.2g}" in line
    assert "vs baseline: two-sided Fisher exact p" in text
    # `report` reads the same comparison back from the results file.
    assert main(["report", str(out), "--json"]) == 0
    data = {c["config"]: c for c in json.loads(capsys.readouterr().out)["configs"]}
    assert "vs_baseline" not in data[base] and data[fixed]["vs_baseline"]["baseline"] == base


def test_program_variants_need_a_factory_that_takes_them(foreign, tmp_path, capsys):
    rc = main(["stress", "--program", f"{foreign}:make", "--variants", "baseline,barrier", "--steps", "2",
               "--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "variant" in err[0] and err[0].startswith("error:"), err
    assert not (tmp_path / "x" / "stress.jsonl").exists()
    # A flag set needs nothing of the program.
    rc = main(["stress", "--program", f"{foreign}:make", "--variants", "baseline,xla-no-fusion", "--steps", "2",
               "--out", str(tmp_path / "y"), "--quiet"])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.slow
def test_builtin_variants_keep_the_loss_trajectory(tmp_path, capsys):
    out = tmp_path / "o"
    names = ("baseline", "barrier", "onehot", "sumgrad")
    rc = main(["stress", "--modes", "full", "--remat", "on", "--seeds", "1", "--steps", "5",
               "--variants", ",".join(names), "--out", str(out), "--json", "--quiet", *TINY_ARGS])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    labels = [f"full/remat=on/f32[variant={v}]" for v in names]
    assert [c["config"] for c in data["configs"]] == labels
    assert len({fp["id"] for fp in data["fingerprints"].values()}) == 4  # each variant compiles differently
    for c in data["configs"][1:]:
        assert c["vs_baseline"]["compared_steps"] == 5
        assert c["vs_baseline"]["max_loss_rel_diff"] <= LOSS_RTOL
    # Every block records its variant in its configuration.
    blocks = results.read_results(out / "stress.jsonl").blocks
    assert {b.config["variant"] for b in blocks} == set(names)


@pytest.mark.slow
def test_issue_35409_preset_variants_from_the_cli(tmp_path):
    """The #35409 preset, shrunk, with every program variant and the CPU flag set."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    names = "baseline,barrier,onehot,sumgrad,xla-no-fusion"
    res = subprocess.run(
        [sys.executable, "-m", "xla_harness.cli", "stress", "--program", "issue-35409",
         "--program-option", "scale=0.015625", "--program-option", "seq_scale=0.125",
         "--program-option", "layers=(1, 2)", "--program-option", "lr=0.001", "--variants", names,
         "--seeds", "1", "--steps", "4", "--out", str(tmp_path / "o"), "--json", "--quiet"],
        env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    got = [c["config"] for c in data["configs"]]
    options = {"scale": 0.015625, "seq_scale": 0.125, "layers": (1, 2), "lr": 0.001}
    assert got == [records.label({**options, "variant": v}, "issue-35409") for v in names.split(",")]
    for c in data["configs"][1:]:
        assert c["vs_baseline"]["compared_steps"] == 4 and c["vs_baseline"]["max_loss_rel_diff"] <= LOSS_RTOL
    assert data["gaps"] == []  # every label the header asks for was recorded
    assert len({fp["id"] for fp in data["fingerprints"].values()}) == 5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["barrier", "sumgrad", "onehot"])
def test_builtin_variants_change_the_compiled_step_as_intended(name):
    """The built-in takes the variants with the preset's effect: the baseline scatters the lookup's
    gradient onto the dense gradient of W; barrier/sumgrad only into fresh zeros; onehot not at all."""
    import jax

    from xla_harness.hlo.parser import parse_module
    from xla_harness.hlo.tied import tied_summary
    from xla_harness.programs import tied_embedding
    from xla_harness.programs.variants import variant_program

    def summary(variant):
        prog = variant_program(tied_embedding.program, variant, **TINY)
        key = jax.random.key(0)
        params, opt_state = prog.init(key)
        text = prog.jit().lower(params, opt_state, prog.batch(key, 0)).compile().as_text()
        return tied_summary(parse_module(text), (TINY["vocab"], TINY["d_model"]))

    base, var = summary("baseline"), summary(name)
    assert base.gathers >= 1 and base.scatter_onto_dense >= 1
    if name == "onehot":
        assert var.gathers == 0 and not var.scatters and var.dots > base.dots
    else:
        assert var.scatters and {s.in_place_source for s in var.scatters} == {"broadcast"}
        assert var.gathers == base.gathers and var.dots == base.dots
