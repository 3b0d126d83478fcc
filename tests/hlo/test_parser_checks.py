"""What changes the scan's answer is refused as XLA's parser refuses it: a declared result
shape that is not the root's (a deleted ROOT line among those), parameter numbers taken
twice or out of range; truncated text names the bracket left open. (XLA's parser run in a
child process, where its crash is a verdict: tests/hlo/test_xla_oracle.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_harness import jaxcompat
from xla_harness.cli import main
from xla_harness.hlo.lexer import match_brace
from xla_harness.hlo.parser import HloParseError, parse_module
from xla_harness.hlo.scan import scan
from xla_harness.hlo.xla_oracle import compare

HLO = Path(__file__).resolve().parent


needs_xla = pytest.mark.skipif(not jaxcompat.xla_hlo_reads_structure(),
                               reason="not checked: this jaxlib does not expose XLA's parsed HLO (jaxlib >= 0.12 does)")


FUSED = """HloModule m

%fused (p0: f32[8], p1: s32[]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %p1 = s32[]{:T(128)} parameter(1)
  %one = f32[1]{0} broadcast(f32[] constant(1)), dimensions={}
  ROOT %dus = f32[8]{0} dynamic-update-slice(%p0, %one, %p1)
}

ENTRY %main (a: f32[8], i: s32[]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %f = f32[8]{0} fusion(%a, %i), kind=kLoop, calls=%fused
}
"""


def _edit(old: str, new: str, text: str = FUSED) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


# (name, text, what the single error line says, its line number); each is refused by XLA too
REFUSED = [
    ("deleted ROOT line", _edit("  ROOT %dus = f32[8]{0} dynamic-update-slice(%p0, %one, %p1)\n", ""),
     "declares result shape f32[8], but its last instruction 'one' (line 6; there is no ROOT line", 3),
    ("result element type", _edit("-> f32[8] {\n  %p0", "-> s32[8] {\n  %p0"),
     "computation fused declares result shape s32[8], but its root 'dus' (line 7) has shape f32[8]{0}", 3),
    ("result dims", _edit("s32[]) -> f32[8] {\n  %a", "s32[]) -> f32[9] {\n  %a"),
     "computation main declares result shape f32[9]", 10),
    ("result tuple", _edit("s32[]) -> f32[8] {\n  %a", "s32[]) -> (f32[8]) {\n  %a"),
     "computation main declares result shape (f32[8])", 10),
    ("parameter number twice", _edit("%p1 = s32[]{:T(128)} parameter(1)", "%p1 = s32[]{:T(128)} parameter(0)"),
     "p1: parameter number 0 is used twice in computation fused (first by 'p0' at line 4)", 5),
    ("parameter number negative", _edit("%i = s32[] parameter(1)", "%i = s32[] parameter(-1)"),
     "i: parameter number -1 is negative", 12),
]


# XLA's parser aborts the process on these (a CHECK failure), so they are not run in this one.
OUT_OF_RANGE = [
    ("parameter number past the last", _edit("%p1 = s32[]{:T(128)} parameter(1)", "%p1 = s32[]{:T(128)} parameter(2)"),
     "p1: parameter number 2 is out of range: computation fused has 2 parameter(s), numbered 0..1", 5),
    ("parameter numbers with a gap", _edit("%i = s32[] parameter(1)", "%i = s32[] parameter(3)"),
     "i: parameter number 3 is out of range", 12),
]


ACCEPTED = [  # what XLA's parser takes and the checks must let through
    ("the original", FUSED),
    ("declared layout differs from the root's", _edit("-> f32[8] {\n  %p0", "-> f32[8]{0:T(256)} {\n  %p0")),
    ("no ROOT line in a one-instruction computation",
     "HloModule m\n\nENTRY %e (a: f32[2]) -> f32[2] {\n  %a = f32[2]{0} parameter(0)\n}\n"),
    ("no ROOT line, the last instruction has the declared shape",
     _edit("  ROOT %dus = f32[8]{0}", "  %dus = f32[8]{0}")),
    ("parameters written out of order", _edit("  %p0 = f32[8]{0} parameter(0)\n  %p1 = s32[]{:T(128)} parameter(1)\n",
                                              "  %p1 = s32[]{:T(128)} parameter(1)\n  %p0 = f32[8]{0} parameter(0)\n")),
    ("a signature that is not the parameters' (XLA does not compare them)",
     _edit("%fused (p0: f32[8], p1: s32[])", "%fused (q: s32[3])")),
]


@pytest.mark.parametrize("name,text,needle,line", REFUSED + OUT_OF_RANGE, ids=[c[0] for c in REFUSED + OUT_OF_RANGE])
def test_refused_with_one_error_line(tmp_path, capsys, name, text, needle, line):
    bad = tmp_path / "bad.hlo"
    bad.write_text(text)
    assert main(["scan", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}:{line}: ") and needle in err[0], err


@pytest.mark.parametrize("name,text", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_as_xla_accepts(name, text):
    module = parse_module(text)
    assert module.entry.root.shape.dims in ((8,), (2,))


def test_deleted_root_line_would_change_the_answer():
    """Why the check matters: read with the last instruction as root, the fusion has no
    in-place output at all (the dynamic-update-slice's pair disappears)."""
    findings, _, _ = scan(parse_module(FUSED))
    assert [f.cls for f in findings] == ["aliased"]
    with pytest.raises(HloParseError, match="there is no ROOT line"):
        parse_module(REFUSED[0][1])


@needs_xla
@pytest.mark.parametrize("name,text,needle,line", REFUSED, ids=[c[0] for c in REFUSED])
def test_xla_refuses_them_too(name, text, needle, line):
    verdict = compare(text)
    assert not verdict.xla_accepts and not verdict.ours_accepts and verdict.category == "agree", verdict


@needs_xla
@pytest.mark.parametrize("name,text", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_xla_accepts_them_too(name, text):
    verdict = compare(text)
    assert verdict.category == "agree" and verdict.xla_accepts and not verdict.mismatch, verdict


# ----------------------------------------------------------------------------- truncation


@pytest.mark.parametrize("text,opener", [
    ('backend_config={"a":{"b":0', "{"),
    ('backend_config={"a":[1,2', "["),
    ("metadata={op_name=(x", "("),
])
def test_truncation_names_the_bracket_left_open(text, opener):
    with pytest.raises(ValueError) as exc:
        match_brace(text, text.index("{"))
    assert str(exc.value) == f"unbalanced '{opener}': the text ends before its '{dict(['{}', '[]', '()'])[opener]}'"


def test_truncated_file_error_names_the_open_brace(tmp_path, capsys):
    bad = tmp_path / "cut.hlo"
    bad.write_text('HloModule m\nENTRY e {\n  a = f32[2]{0} parameter(0)\n'
                   '  ROOT b = f32[2]{0} custom-call(a), custom_call_target="t", backend_config={"x":{"y":10')
    assert main(["scan", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}:4: truncated module"), err
    assert "unbalanced '{': the text ends before its '}'" in err[0], err


def test_mismatched_closer_names_both():
    with pytest.raises(ValueError, match=r"unbalanced '\]', expected '\}'"):
        match_brace("{a]", 0)
