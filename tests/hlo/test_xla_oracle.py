"""XLA's parser runs in a child process (xla_harness.hlo.xla_oracle), where its crash or hang is a
verdict and the batch goes on; bench/scan_speed.py reports such a crash as one error line. The
modules read are those of tests/hlo/test_parser_checks.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness import jaxcompat
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.xla_oracle import IsolatedXlaParser, compare, compare_many

from .test_parser_checks import ACCEPTED, FUSED, OUT_OF_RANGE

needs_xla = pytest.mark.skipif(not jaxcompat.xla_hlo_reads_structure(),
                               reason="not checked: this jaxlib does not expose XLA's parsed HLO (jaxlib >= 0.12 does)")


# ----------------------------------------------------------------------------- XLA out of process


# A scheduled module whose async call gets its operands from a call-update: our reader takes
# it, XLA's parser aborts the process ("call is not scheduled after its operand async_param"),
# as on libtpu's scheduled dumps with SparseCore gathers.
XLA_CRASHES = """HloModule m, is_scheduled=true

%c (x: f32[2], y: f32[2]) -> f32[2] {
  %x = f32[2]{0} parameter(0)
  %y = f32[2]{0} parameter(1)
  ROOT %n = f32[2]{0} add(%x, %y)
}

ENTRY %e (p: f32[2], q: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  %q = f32[2]{0} parameter(1)
  %s = ((), (), (s32[1]{0})) call-start(), async_execution_thread="sparsecore", to_apply=%c
  %u = ((f32[2]{0}, f32[2]{0}), f32[2]{0}) call-update(%s, %p, %q)
  ROOT %d = f32[2]{0} call-done(%u)
}
"""


@pytest.mark.slow
@needs_xla
def test_xla_crash_is_a_verdict_and_the_batch_goes_on():
    texts = [(FUSED, "fused"), (XLA_CRASHES, "crashes"), (OUT_OF_RANGE[0][1], "out-of-range"), (FUSED, "again")]
    first, crashed, out_of_range, again = compare_many(texts, timeout=120)
    assert first.category == "agree" and first.xla_accepts and not first.mismatch, first
    assert crashed.category == "xla-crashed" and crashed.ours_accepts and not crashed.xla_accepts, crashed
    assert crashed.xla_crashed.startswith("SIGABRT") and "not scheduled after its operand" in crashed.xla_crashed
    assert crashed.xla_error.startswith("XLA's parser crashed (SIGABRT")
    assert out_of_range.category == "xla-crashed" and not out_of_range.ours_accepts
    assert "Check failed: param_no >= 0 && param_no < parameter_count" in out_of_range.xla_crashed
    assert again.category == "agree" and again.xla_accepts and again.reprint == first.reprint


@pytest.mark.slow
@needs_xla
def test_isolated_verdict_and_structure_are_the_in_process_ones():
    with IsolatedXlaParser(timeout=120) as xla:
        for _, text in ACCEPTED:
            isolated, local = compare(text, xla=xla), compare(text)
            assert (isolated.category, isolated.mismatch, isolated.reprint) == (local.category, local.mismatch,
                                                                                local.reprint)
        planted = parse_module(FUSED)
        planted.computations[0].by_name["one"].opcode = "negate"
        parsed = xla.parse(FUSED)
        from xla_harness.hlo.xla_oracle import compare_to_structure
        assert parsed.structure is not None
        assert compare_to_structure(planted, parsed.structure, parsed.entry) == \
            "computation fused: one: opcode ours negate, XLA broadcast"
        assert xla.parse(None).accepts  # the same text again, not sent twice


@pytest.mark.slow
@needs_xla
def test_xla_hang_is_a_verdict(tmp_path):
    with IsolatedXlaParser(timeout=0.01) as xla:  # no answer in time: the child is killed
        verdict = xla.parse(FUSED)
    assert not verdict.accepts and verdict.crashed.startswith("no answer in 0.01 s, killed (SIGKILL")


BENCH = Path(__file__).resolve().parents[2] / "bench/scan_speed.py"


@pytest.mark.slow
@needs_xla
def test_bench_reports_an_xla_crash_as_one_error_line(tmp_path):
    crash = tmp_path / "scheduled.hlo"
    crash.write_text(XLA_CRASHES)
    run = subprocess.run([sys.executable, str(BENCH), "--hlo", str(crash), "--repeat", "1", "--as-written"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    err = run.stderr.strip().splitlines()
    assert len(err) == 1, run.stderr
    assert err[0].startswith("error: XLA's parser crashed (SIGABRT: Check failed: ") and "not scheduled" in err[0], err


@pytest.mark.slow
@needs_xla
def test_bench_times_the_unscheduled_copy_of_a_module_xla_aborts_on_as_scheduled(tmp_path):
    """libtpu's dumps: jaxlib's parser aborts on the scheduled module; the bench says so and times
    both parsers on the module without is_scheduled=true (the same instructions)."""
    crash = tmp_path / "scheduled.hlo"
    crash.write_text(XLA_CRASHES)
    run = subprocess.run([sys.executable, str(BENCH), "--hlo", str(crash), "--repeat", "2"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "XLA's parser crashed on the scheduled module (SIGABRT" in out and "unscheduled copy" in out
    assert "module: 8 instructions" in out and "over 2 rounds" in out
