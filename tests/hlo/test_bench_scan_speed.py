"""bench/scan_speed.py measures what it says (no timing asserted here): the generated module
has the fusions it is built from, the scan finds each of them, and bad input is one error line."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness import jaxcompat
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.scan import scan
from xla_harness.hlo.xla_oracle import compare

BENCH = Path(__file__).resolve().parents[2] / "bench/scan_speed.py"
_spec = importlib.util.spec_from_file_location("scan_speed", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.skipif(not jaxcompat.xla_hlo_reads_structure(),
                    reason="not checked: this jaxlib's parsed HLO has no instruction shapes (jaxlib >= 0.12 has)")
def test_generated_module_is_what_xla_reads_and_every_fusion_is_classified():
    text = bench.generate(400)
    verdict = compare(text)
    assert verdict.xla_accepts and verdict.category == "agree", (verdict.mismatch, verdict.ours_error)
    mod = parse_module(text, "bench")
    fusions = sum(i.opcode == "fusion" for i in mod.entry.instructions)
    assert fusions == 50 and mod.instruction_count() >= 400
    findings, decisions, backend = scan(mod)
    assert backend == "unknown"  # both backend rules are applied, as on an unlabelled dump
    assert len(findings) == fusions  # one in-place output each
    # the transposes alternate between a data-moving and a bitcast layout
    assert sorted(f.cls for f in findings) == ["hazard"] * 25 + ["layout-preserving-miss"] * 25
    assert len(decisions) == 25  # the data-moving transpose fused into the scatter


@pytest.mark.slow
def test_bench_runs_and_refuses_bad_input(tmp_path):
    run = subprocess.run([sys.executable, str(BENCH), "--instructions", "200", "--repeat", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "ratio python/c++" in run.stdout and "25 in-place fusion outputs" in run.stdout
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  ROOT a = f32[] add(x, y)\n}\n")
    for args in (["--hlo", str(bad)], ["--hlo", str(tmp_path / "missing.hlo")], ["--repeat", "0"]):
        run = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300)
        assert run.returncode == 2, (args, run.stderr)
        assert "Traceback" not in run.stderr and run.stderr.count("error:") == 1, run.stderr
