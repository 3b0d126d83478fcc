"""Pre-fusion modules for the blast radius (``python -m xla_harness.upstream.prefusion``): the fusion
pass of each target named in one place, the files blast-radius reads found by those names, a bad
target or program refused, a compile that dumps no module refused, and (with libtpu / the CUDA
plugin, which skip naming what to install) a small program dumped as it enters the TPU's and the
GPU's fusion pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.targets import HOST, parse_target
from xla_harness.targets.devices import missing
from xla_harness.upstream import prefusion, xlatest, xlatest_blast

V6E = parse_target("tpu:v6e:2x4")
H100 = parse_target("cuda:h100")
ROOT = Path(__file__).resolve().parents[2]


def test_each_target_has_one_fusion_pass_and_its_file_name():
    assert {k: v.name for k, v in prefusion.FUSION_PASSES.items()} == {
        "host": "fusion", "tpu": "tpu_fusion", "cuda": "priority-fusion"}
    assert prefusion.FUSION_PASSES["tpu"].pass_re == "^tpu_fusion$"
    assert prefusion.FUSION_PASSES["cuda"].glob == "*.before_priority-fusion.txt"


def test_blast_radius_finds_the_modules_of_every_target_and_nothing_else(tmp_path):
    names = [
        "module_0066.jit__lambda.0000.HLO_passes_after_layout_assignment.after_reshape-decomposer.before_fusion.txt",
        "module_0000.jit__lambda.cl_1.0000.Main_fusion.after_pipeline-start.before_tpu_fusion.txt",
        "module_0001.jit__lambda.0000.fusion.after_sort-iota-fusion.before_priority-fusion.txt",
    ]
    others = [
        "module_0000.jit__lambda.cl_1.0001.Main_fusion.after_tpu_fusion.before_pipeline-end.txt",  # after the pass
        "module_0001.jit__lambda.0001.fusion.after_priority-fusion.before_cse.txt",
        "module_0001.jit__lambda.priority_fusion_dump.txt",
        "module_0000.jit__lambda.cl_1.after_optimizations.txt",
    ]
    (tmp_path / "sub").mkdir()
    for n in names[:2] + others:
        (tmp_path / n).write_text("HloModule m\n")
    (tmp_path / "sub" / names[2]).write_text("HloModule m\n")
    found = prefusion.prefusion_modules(tmp_path)
    assert sorted(p.name for p in found) == sorted(names)


def test_a_bad_target_is_one_error(tmp_path, capsys):
    assert prefusion.main(["--out", str(tmp_path), "--target", "tpu:v9:2x4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --target tpu:v9:2x4: unknown TPU generation")
    assert not any(tmp_path.iterdir())


def test_an_unknown_program_is_refused_before_compiling(tmp_path):
    with pytest.raises(HarnessError, match="unknown program 'issue_35409' for --target host"):
        prefusion.dump(tmp_path, HOST, ("issue_35409",))  # #35409 is for TPU and GPU targets only


def test_a_compile_that_dumps_no_module_is_refused(tmp_path):
    # Planted failure: this process compiles without --xla_dump_to, as a compile that never reaches
    # a pass of that name would: the program is named, not counted as a module with no pairs.
    with pytest.raises(HarnessError, match=r"embedding_grad compiled on the CPU but dumped no "
                       r"\*\.before_fusion\.txt module"):
        prefusion.dump(tmp_path, HOST, ("embedding_grad",))


def test_blast_radius_without_modules_names_every_pattern(tmp_path, capsys):
    (tmp_path / "m.after_tpu_fusion.before_cse.txt").write_text("HloModule m\n")
    assert xlatest.main(["blast-radius", "--xla-src", str(tmp_path), "--modules", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and prefusion.module_patterns() in err[0]


def test_modules_the_parser_refuses_are_named_with_its_message():
    stderr = ("unparsable\t/d/m1.before_tpu_fusion.txt\tSyntax error: expected '}' at 3:17\n"
              "unreadable\t/d/m2.before_fusion.txt\n"
              "W0000 a warning line\n")
    assert xlatest_blast.refused_modules(stderr) == [
        ("/d/m1.before_tpu_fusion.txt", "Syntax error: expected '}' at 3:17"),
        ("/d/m2.before_fusion.txt", "unreadable")]
    assert xlatest_blast.refused_modules("") == []


def _dump(target: str, program: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xla_harness.upstream.prefusion", "--target", target,
                           "--program", program, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(missing(V6E) is not None, reason=str(missing(V6E)))
def test_a_small_program_dumped_as_it_enters_the_tpu_fusion_pass(tmp_path):
    res = _dump("tpu:v6e:2x4", "transposed_scatter_add", tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "1 programs compiled for tpu:v6e:2x4" in res.stdout
    assert "prefusion: compiled by jax " in res.stdout and "libtpu 0." in res.stdout
    modules = prefusion.prefusion_modules(tmp_path)
    assert modules and all(m.name.endswith(".before_tpu_fusion.txt") for m in modules)
    # libtpu's module: tiled layouts, and the scatter (wrapped in its custom fusion) still there.
    texts = [m.read_text() for m in modules]
    assert any(" scatter(" in t and ":T(8,128)" in t for t in texts)


@pytest.mark.slow
@pytest.mark.skipif(missing(H100) is not None, reason=str(missing(H100)))
def test_a_small_program_dumped_as_it_enters_the_gpu_fusion_pass(tmp_path):
    res = _dump("cuda:h100", "transposed_scatter_add", tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    modules = prefusion.prefusion_modules(tmp_path)
    assert len(modules) == 1 and modules[0].name.endswith(".before_priority-fusion.txt")
    text = modules[0].read_text()
    assert " scatter(" in text and " transpose(" in text  # the data-moving producer the patch refuses
