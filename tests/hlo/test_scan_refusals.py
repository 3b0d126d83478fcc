"""#34 items 10 and 14: scan reads what XLA reads and refuses what XLA refuses, and a folder it is
given can hold anything.

10. A layout {7,9} on a rank-2 shape was "could not be scanned (IndexError ...)"; transpose
    dimensions={5,9} and {0,0} were read and reported as a hazard (exit 1); a fusion without calls=,
    constant literals of the wrong nesting or out of their type's range (an f16 beyond 65504, a bf16
    NaN payload beyond its mantissa), an opcode XLA does not know and an async-update/done with no
    operand were read. Each is now one line naming FILE:LINE (exit 2). The parser-level ones are
    XLA's parser's refusals (compared with it, out of process); layouts and transposes are refused by
    XLA's verifier, which every compile runs.
14. A FIFO inside a folder given to scan hung (or was skipped without a word): every file scan would
    read that is no regular file is refused, one line each, never opened; the rest is scanned.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.hlo.parser import HloParseError, parse_module
from xla_harness.hlo.validate import XLA_OPCODES

from ..bad_input_cases import BAD_HLO, SMALL_HLO

# What the reader must still read (each accepted by XLA's parser): literal forms next to the refused ones.
ODD_LITERALS = {
    "elided": "f32[2,2]{1,0} constant({...})", "nested": "f32[2,2]{1,0} constant({ { 1, 2 }, { 3, 4 } })",
    "one-for-all": "f32[2]{0} constant(1)", "no-commas": "f32[2]{0} constant({1 2})",
    "trailing-comma": "f32[2]{0} constant({1, 2,})", "empty": "f32[0]{0} constant({})",
    "empty-rows": "f32[2,0]{1,0} constant({ {}, {} })", "f32-max": "f32[] constant(3.4028235e38)",
    "f16-rounds-to-max": "f16[] constant(65519)", "bf16-nan-payload": "bf16[] constant(nan(0x7f))",
    "negative-nan": "f32[] constant(-nan(0x1))", "inf": "f16[] constant(-inf)",
    "u64-max": "u64[] constant(18446744073709551615)",
    "s64-min": "s64[] constant(-9223372036854775808)", "pred-int": "pred[2]{0} constant({true, 0})",
    "complex": "c64[2]{0} constant({(1, 2), (3, 4)})", "exponent": "f32[] constant(1E5)",
    "f8-unchecked": "f8e5m2[] constant(60000)", "scalar-tile": "s32[]{:T(128)} constant(1)",
}


@pytest.mark.parametrize("name", sorted(BAD_HLO))
def test_scan_refuses_what_xla_refuses_naming_file_and_line(name, tmp_path, capsys):
    (tmp_path / "m.hlo").write_bytes(BAD_HLO[name])
    assert main(["scan", str(tmp_path / "m.hlo")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path}/m.hlo:") and "could not be scanned" not in err[0]


@pytest.mark.parametrize("name", sorted(ODD_LITERALS))
def test_literals_xla_reads_are_read(name):
    parse_module(f"HloModule m\n\nENTRY e {{\n  ROOT c = {ODD_LITERALS[name]}\n}}\n", name)


@pytest.mark.slow
def test_the_refusals_agree_with_xla_s_parser():
    """Out of process, XLA's own parser: it refuses every parser-level case (and reads every odd
    literal); the layouts and transposes it parses are the verifier's to refuse."""
    from xla_harness.hlo.xla_oracle import compare_many

    verifier_level = {"layout-out-of-range", "layout-repeated", "transpose-out-of-range", "transpose-repeated",
                      "transpose-wrong-result", *(n for n in BAD_HLO if n.startswith("fixture-"))}
    bad = sorted(BAD_HLO)
    verdicts = compare_many([(BAD_HLO[n].decode(), n) for n in bad])
    for name, v in zip(bad, verdicts, strict=True):
        assert not v.ours_accepts, name
        assert v.xla_accepts == (name in verifier_level), (name, v.xla_error)
    odd = sorted(ODD_LITERALS)
    verdicts = compare_many([(f"HloModule m\n\nENTRY e {{\n  ROOT c = {ODD_LITERALS[n]}\n}}\n", n) for n in odd])
    for name, v in zip(odd, verdicts, strict=True):
        assert v.xla_accepts and v.ours_accepts, (name, v.xla_error, v.ours_error)


def test_every_opcode_of_this_jaxlib_is_known():
    """The reader's opcodes hold every one of the installed XLA's (a dump of it is never refused for an
    opcode), and nothing that is not one is read."""
    from xla_harness import jaxcompat
    from xla_harness.hlo.xla_oracle import opcode_text

    with pytest.raises(HloParseError, match="unknown opcode 'frobnicate'"):
        parse_module(BAD_HLO["opcode-unknown"].decode(), "m")
    hlo = jaxcompat.xla_hlo()
    if not hasattr(hlo, "HloOpcode"):
        pytest.skip("this jaxlib does not list its opcodes (no HloOpcode in its bindings)")
    assert {opcode_text(n) for n in hlo.HloOpcode.__members__} <= XLA_OPCODES


def test_a_transpose_that_moves_data_is_still_a_hazard():
    """The checks take nothing the scanner reads away: the committed data-moving transpose fixture still
    scans as a hazard (exit 1)."""
    fixture = Path(__file__).parent / "transpose_moves_data.hlo"
    assert main(["scan", str(fixture)]) == 1


# ----------------------------------------------------------------------------- item 14


class Hung(BaseException):
    pass


def _alarm(signum, frame):
    raise Hung("scan still running after 30 s")


GOOD_BA = (b"allocation 0: size 16, parameter 0, shape |f32[4]| at ShapeIndex {}:\n"
           b" value: <0 p @0> (size=16,offset=0): f32[4]{0}\n")
DUMP = "module_0001.jit_step.after_optimizations"


@pytest.mark.parametrize("files,refused,scanned", [
    ({f"{DUMP}.txt": SMALL_HLO, f"{DUMP}-buffer-assignment.txt": GOOD_BA,
      f"{DUMP}-buffer-assignment-values.txt": None}, f"{DUMP}-buffer-assignment-values.txt", 0),
    ({f"{DUMP}.txt": SMALL_HLO, f"{DUMP}-buffer-assignment.txt": None}, f"{DUMP}-buffer-assignment.txt", 0),
    ({f"{DUMP}.txt": SMALL_HLO, "other.after_optimizations.txt": None}, "other.after_optimizations.txt", 1),
    ({"a.hlo": SMALL_HLO, "sub/b.hlo": None}, "sub/b.hlo", 1),
    ({"a.txt": SMALL_HLO, "b.txt": None}, "b.txt", 1),
], ids=["values-file", "buffer-assignment", "beside-a-dump", "in-a-subfolder", "beside-hlo-text"])
def test_a_fifo_in_a_folder_is_refused_never_opened(files, refused, scanned, tmp_path, capsys):
    d = tmp_path / "d"
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            os.mkfifo(d / rel)
        else:
            (d / rel).write_bytes(data)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        code = main(["scan", str(d)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    out, err = capsys.readouterr()
    assert code == 2
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [f"error: {d / refused} is not a regular file"
                                                                           + ("" if refused.endswith(
                                                                               ("assignment.txt", "values.txt"))
                                                                              else " (skipped: it could block)")]
    assert f"scanned {scanned} module(s)" in out


def test_a_link_to_a_device_beside_a_dump_is_refused(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / f"{DUMP}.txt").write_bytes(SMALL_HLO)
    (d / f"{DUMP}-buffer-assignment.txt").write_bytes(GOOD_BA)
    os.symlink("/dev/zero", d / f"{DUMP}-buffer-assignment-values.txt")
    assert main(["scan", str(d)]) == 2
    assert "buffer-assignment-values.txt is not a regular file" in capsys.readouterr().err
