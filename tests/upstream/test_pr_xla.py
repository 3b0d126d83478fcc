"""make pr TARGET=xla: PR.md's evidence is the change's own (per base: tests, the tests that fail on
stock, mutants, blast radius), names every run it lacks, and says what was not run, the known limits
and what is known about TPU; no CPU stress tables."""

import shutil
from pathlib import Path

from xla_harness.cli import main
from xla_harness.upstream.series import load_series

ROOT = Path(__file__).resolve().parents[2]
XLA = load_series().upstream("xla")


def _pr(tmp_path, results: Path, name: str = "APPENDIX.md") -> str:
    """The bundle's APPENDIX.md (the evidence), or another of its files."""
    out = tmp_path / "pr"
    assert main(["pr", "--target", "xla", "--out", str(out), "--results", str(results)]) == 0
    return (out / name).read_text()


def _results_copy(tmp_path) -> Path:
    results = tmp_path / "res"
    shutil.copytree(ROOT / "results" / "xla", results / "xla")
    shutil.copytree(ROOT / "results" / "cpu" / "stress", results / "cpu" / "stress")  # must not be shown
    return results


def test_xla_pr_evidence_sections(tmp_path):
    desc = _pr(tmp_path, _results_copy(tmp_path))
    evidence = desc.split("## Evidence")[1].split("## What was run where")[0]
    for b in (b for b in XLA.bases if b.series == "default"):
        row = next(ln for ln in evidence.splitlines() if ln.startswith(f"| {b.commit[:10]} |"))
        assert " pass | " in row and " fail | " in row and " killed | " in row, row
    assert "The new tests that fail on stock sources" in evidence
    assert "`InstructionFusionTest.ShouldFuseInPlaceOpForbidsTransposeIntoScatter`" in evidence
    assert "Not run: Bazel" in evidence and "GPU execution" in evidence
    # the committed blast radius over the TPU's and GPU's pre-fusion modules is cited, with its verdict
    assert "Not measured: pre-fusion modules" not in evidence
    for target in ("tpu", "cuda"):
        assert f"/xla/131bf41acb/xla-blast-radius-{target}.log`" in evidence.split("Other pre-fusion")[1]
        assert f"/xla/131bf41acb/xla-blast-radius-{target}.log`: xla-blast-radius: " in evidence
    limits = evidence.split("### Known limits")[1].split("###")[0]
    assert "reads a larger buffer" in limits and "inside a nested fusion" in limits
    # a test that passes on stock and under every mutant is named a regression test, never evidence
    stock_list = evidence.split("The new tests that fail on stock sources")[1].split("Blast radius")[0]
    assert "ShouldFuseInPlaceOpAllowsElementwiseIntoScatter" not in stock_list
    assert "`ShouldFuseInPlaceOpAllowsElementwiseIntoScatter` is a regression test, not evidence" in desc
    tpu = evidence.split("### TPU")[1]
    assert "not established" in tpu and "closed libtpu" in tpu
    assert "seed 1" not in desc and "cpu/stress" not in desc and "Stress tables" not in desc
    assert "| variant |" in desc.split("## What was run where")[1]


def test_a_missing_base_log_is_named_not_skipped(tmp_path):
    results = _results_copy(tmp_path)
    b = next(b for b in XLA.bases if b.series == "default")
    folder = results / Path(b.evidence).parent.relative_to("results")
    (folder / "xla-mutants.log").unlink()
    desc = _pr(tmp_path, results)
    missing = f"{Path(b.evidence).parent}/xla-mutants.log"
    row = next(ln for ln in desc.splitlines() if ln.startswith(f"| {b.commit[:10]} |"))
    assert f"not recorded (`{missing}` missing)" in row
    assert "Not recorded (these runs are missing" in desc and f"`{missing}`" in desc.split("Not recorded (")[1]
    # with nothing recorded at all, every base's every log is named
    empty = tmp_path / "empty"
    empty.mkdir()
    desc = _pr(tmp_path / "e", empty)
    assert "Not measured: pre-fusion modules of the TPU and CUDA" in desc
    for b in (b for b in XLA.bases if b.series == "default"):
        assert f"`{b.evidence}`" in desc.split("Not recorded (")[1]


def test_other_pre_fusion_modules_are_cited_when_present(tmp_path):
    results = _results_copy(tmp_path)
    b = next(b for b in XLA.bases if b.series == "default")
    folder = results / Path(b.evidence).parent.relative_to("results")
    (folder / "xla-blast-radius-tpu-aot.log").write_text(
        "xla-blast-radius: 4 pre-fusion modules from m, 1 with in-place candidate pairs, 3 pairs evaluated, "
        "0 decisions changed\n")
    desc = _pr(tmp_path, results)
    assert "Other pre-fusion modules: " in desc and "xla-blast-radius-tpu-aot.log" in desc
    assert "Not measured: pre-fusion modules" not in desc


def test_the_pr_a_reviewer_reads_is_short_and_says_what_it_refuses(tmp_path):
    """PR.md: what is refused and why, what it changes (every blast radius recorded, GPU's rule beside
    it), the change, its tests with the bazel command, its limits; under 1,200 words, the harness's
    evidence in APPENDIX.md."""
    results = _results_copy(tmp_path)
    desc = _pr(tmp_path, results, "PR.md")
    assert len(desc.split()) < 1200, len(desc.split())
    heads = [ln for ln in desc.splitlines() if ln.startswith("## ")]
    assert heads == ["## What this refuses, and why", "## What it changes", "## Why not GPU's rule",
                     "## The change", "## Tests", "## Known limits", "## Evidence"]
    assert "bazel test //xla/service:instruction_fusion_test" in desc and "`APPENDIX.md`" in desc
    assert "make xla-test" not in desc and "xla-harness" not in desc
    blast = desc.split("## What it changes")[1].split("## Why not")[0]
    for log in sorted((results / "xla").glob("*/xla-blast-radius*.log")):
        kind = log.name.removeprefix("xla-blast-radius").removesuffix(".log")
        if kind != "-tpu-aot":
            assert f", base {log.parent.name}: " in blast, log
    assert "CPU, GPU's scatter rule applied generically instead of this change, base 131bf41acb: 24 of 83" in blast
    # each line says what it was measured over, as its log's header does (the CPU and TPU program sets differ)
    assert "CPU (XLA's own pipeline), base 131bf41acb: 2 of 83 decisions change (53 modules of 18 JAX programs)" \
        in blast
    assert "(95 modules of 19 JAX programs)" in blast and "18 JAX programs:" not in blast
    assert "changes 24 of 83 decisions against this change's 2 of 83" in desc
    assert "## Problem" in _pr(tmp_path / "again", results)  # the appendix keeps the long form
