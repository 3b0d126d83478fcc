"""What a GPU runs non-deterministically (xla_harness/hlo/nondeterminism.py, `scan`), and the
`deterministic` compiler-flag variant that removes it.

The fixture (tests/data/nondeterminism_scatters.hlo) holds one scatter of each kind XLA's determinism
test tells apart; only the float add with indices not marked unique is listed, with its source lines
read through the dump's stack-frame tables. The variant is compiled ahead of time for cuda:h200 (the
CUDA plugin, seconds on the quickstart program): its scatters become sorted, unique-index scatters
without atomics, and the compile needs Triton gemm fusions off there; on CPU and TPU it is refused
with the reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.hlo.nondeterminism import SourceLines, format_ops, nondeterministic_ops
from xla_harness.hlo.parser import parse_module
from xla_harness.programs.variants import FLAG_SETS, check_variants
from xla_harness.targets import Target
from xla_harness.targets.devices import missing

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "nondeterminism_scatters.hlo"
TEXT = FIXTURE.read_text()
QUICKSTART = str(ROOT / "examples" / "quickstart" / "my_model.py") + ":make"
H200 = Target("cuda", "h200", "1x1x1")
needs_cuda_plugin = pytest.mark.skipif(missing(H200) is not None, reason=str(missing(H200)))


def _listed(text: str, backend: str = "gpu") -> list[str]:
    return [op.instruction for op in nondeterministic_ops(parse_module(text, "m"), backend)]


def test_only_the_order_dependent_scatter_with_atomics_is_listed_with_its_source():
    [op] = nondeterministic_ops(parse_module(TEXT, "m"), "gpu")
    assert (op.instruction, op.fusion, op.shape) == ("scatter.emb", "input_scatter_fusion", "f32[64,32]{1,0}")
    assert "atomic read-modify-write" in op.reason and "a f32 add" in op.reason
    assert op.source == "model.py:12 (lookup) <- model.py:40 (loss)"  # the frame, then its parent


@pytest.mark.parametrize("old,new", [
    # not unique any more: the same float add, now with atomics
    ("indices_are_sorted=true, unique_indices=true, to_apply=%add_f32", "to_apply=%add_f32"),
    # a float combiner instead of the integer add (an integer add is order-independent)
    ("ROOT %isum = s32[] add(", "ROOT %isum = s32[] subtract("),
    # maximum -> add: order-dependent in floats
    ("ROOT %mx = f32[] maximum(", "ROOT %mx = f32[] add("),
    # two indices instead of one
    ("one: s32[1,1], upd1: f32[1,32]", "one: s32[2,1], upd1: f32[2,32]"),
])
def test_each_planted_change_makes_one_more_scatter_nondeterministic(old, new):
    assert TEXT.count(old) == 1
    planted = TEXT.replace(old, new)
    if "s32[2,1]" in new:
        planted = (planted.replace("%one = s32[1,1]{1,0}", "%one = s32[2,1]{1,0}")
                   .replace("%upd1 = f32[1,32]{1,0}", "%upd1 = f32[2,32]{1,0}")
                   .replace("s32[1,1]{1,0} %one, f32[1,32]{1,0} %upd1", "s32[2,1]{1,0} %one, f32[2,32]{1,0} %upd1"))
    assert len(_listed(planted)) == 2


def test_other_backends_are_not_assessed():
    assert _listed(TEXT, "cpu") == [] and _listed(TEXT, "tpu") == []
    assert format_ops([], "cpu") == []
    assert format_ops([], "gpu") == ["  0 instruction(s) run non-deterministically on gpu (no scatter without "
                                     "unique indices and an order-dependent combiner)"]


def test_source_lines_from_older_metadata_and_without_tables():
    old = TEXT.replace("stack_frame_id=2", 'source_file="train.py" source_line=7')
    [op] = nondeterministic_ops(parse_module(old, "m"), "gpu")
    assert op.source == "train.py:7"
    bare = TEXT[TEXT.index("// Scatters"):].replace("stack_frame_id=2", "")
    [op] = nondeterministic_ops(parse_module("HloModule scatters\n\n" + bare, "m"), "gpu")
    assert op.source == ""
    # a parent that is not an earlier frame ends the walk (no loop on a malformed table)
    assert SourceLines("StackFrames\n1 {file_location_id=1 parent_frame_id=5}\n").frames(1) == []


def test_scan_prints_and_records_them(capsys):
    assert main(["scan", "--backend", "gpu", str(FIXTURE)]) == 0  # not a hazard: the exit code stays 0
    out = capsys.readouterr().out
    assert "1 instruction(s) run non-deterministically on gpu:" in out
    assert "nondeterministic  input_scatter_fusion (scatter.emb)  f32[64,32]{1,0}" in out
    assert "from model.py:12 (lookup) <- model.py:40 (loss)" in out
    assert main(["scan", "--backend", "gpu", "--json", str(FIXTURE)]) == 0
    [module] = json.loads(capsys.readouterr().out)["modules"]
    assert [op["instruction"] for op in module["nondeterministic"]] == ["scatter.emb"]
    assert main(["scan", "--backend", "cpu", "--json", str(FIXTURE)]) == 0
    [module] = json.loads(capsys.readouterr().out)["modules"]
    assert "nondeterministic" not in module  # not assessed there


def test_the_deterministic_variant_is_refused_where_there_is_no_such_flag(capsys):
    with pytest.raises(HarnessError, match="belongs to its GPU compiler"):
        check_variants(["baseline", "deterministic"], "cpu")
    with pytest.raises(HarnessError, match="is for gpu, but the step compiles for tpu"):
        check_variants(["barrier+deterministic"], "tpu")
    check_variants(["baseline", "deterministic"], "gpu")
    fs = FLAG_SETS["deterministic"]
    assert fs.env_text() == "--xla_gpu_deterministic_ops=true"
    assert fs.env_text(ahead_of_time=True) == "--xla_gpu_deterministic_ops=true --xla_gpu_enable_triton_gemm=false"
    assert fs.compiler_options(ahead_of_time=True) == {"xla_gpu_deterministic_ops": True,
                                                       "xla_gpu_enable_triton_gemm": False}


@pytest.mark.parametrize("extra", [["--compile-only"], ["--steps", "2", "--out", "{tmp}/run"]])
def test_cpu_refuses_the_variant_before_anything_compiles(tmp_path, capsys, extra):
    argv = ["stress", "--program", QUICKSTART, "--variants", "baseline,deterministic", "--seeds", "1", "--quiet",
            *[a.format(tmp=tmp_path) for a in extra]]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("error:") == 1 and "belongs to its GPU compiler" in captured.err
    assert "step fingerprint" not in captured.out  # refused whole, not after the baseline row


@pytest.mark.slow
@needs_cuda_plugin
def test_the_deterministic_row_lowers_its_scatters_without_atomics(tmp_path, capsys):
    """--variants baseline,deterministic --compile-only --target cuda:h200: the baseline's scatters use
    atomics, the deterministic row's are sorted unique-index scatters after a sort; its record says
    which flags the compile got (Triton gemm fusions off, ahead of time only)."""
    out = tmp_path / "aot"
    assert main(["stress", "--program", QUICKSTART, "--variants", "baseline,deterministic", "--compile-only",
                 "--target", "cuda:h200:1x1x1", "--out", str(out), "--quiet"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "step fingerprint" in ln]
    assert len(lines) == 2
    assert re.search(r"; 2 scatter\(s\) with atomics", lines[0]) and "; 0 scatter(s) with atomics" in lines[1]
    base, det = (json.loads(ln) for ln in (out / "compile.jsonl").read_text().splitlines())
    assert det["options"]["variant"] == "deterministic"
    assert det["scan"]["nondeterministic"] == 0 and base["scan"]["nondeterministic"] == 2
    assert det["fingerprint"]["instructions"] > base["fingerprint"]["instructions"]
    base_hlo, det_hlo = ((out / r["hlo"]).read_text() for r in (base, det))
    scatters = [ln for ln in det_hlo.splitlines() if " scatter(" in ln]
    assert len(scatters) == 2 and all("indices_are_sorted=true, unique_indices=true" in ln for ln in scatters)
    assert det_hlo.count(" sort(") == 2 and base_hlo.count(" sort(") == 0
    assert "unique_indices=true" not in base_hlo
    assert det["compiler_options"] == {"xla_gpu_deterministic_ops": True, "xla_gpu_enable_triton_gemm": False}
    assert "compiler_options" not in base


@pytest.mark.slow
@needs_cuda_plugin
def test_ahead_of_time_the_flag_alone_does_not_compile():
    """Why the variant carries --xla_gpu_enable_triton_gemm=false ahead of time: without it the gemm
    autotuner, which has no device, refuses the compile."""
    from dataclasses import replace

    from xla_harness.programs.interface import load_program
    from xla_harness.targets.compile import compile_step
    from xla_harness.targets.devices import prepare_environment, target_devices

    prepare_environment(H200)
    devices = target_devices(H200)
    program = load_program(QUICKSTART)
    alone = replace(program, jit_kwargs={**program.jit_kwargs,
                                         "compiler_options": {"xla_gpu_deterministic_ops": True}})
    with pytest.raises(HarnessError, match="Failed to get configs for"):
        compile_step(alone, H200, devices)
