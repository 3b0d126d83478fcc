"""The scan classifies a fused computation once per structure (:func:`xla_harness.hlo.scan._structure`):
its answer must equal classifying every fusion on its own, on every fixture and on modules whose
fusions differ in exactly one thing the classification reads (a memo keyed without it would give
the second fusion the first one's answer)."""

import gzip
import sys
from pathlib import Path

import pytest

from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.scan import module_json, scan

HLO = Path(__file__).parent
FIXTURES = sorted(HLO.rglob("*.hlo")) + sorted(HLO.rglob("*.hlo.gz"))


def _read(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode()


def _both(text: str, backend: str = "auto"):
    mod = parse_module(text)
    fast = module_json(mod, *scan(mod, backend))
    slow = module_json(mod, *scan(mod, backend, memo=False))
    return fast, slow


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_memo_changes_no_fixture(path):
    fast, slow = _both(_read(path))
    assert fast == slow


def test_memo_changes_nothing_on_the_bench_module():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        from scan_speed import generate
    finally:
        sys.path.pop(0)
    fast, slow = _both(generate(800))
    assert fast == slow
    assert {f["class"] for f in fast["findings"]} == {"hazard", "layout-preserving-miss"}


TWO = """HloModule two

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%f1 (p0: f32[32,64], p1: s32[8,1], p2: f32[8,32]) -> f32[64,32] {
  %p0 = f32[32,64]{1,0} parameter(0)
  %t = f32[64,32]{1,0} transpose(%p0), dimensions={1,0}
  %p1 = s32[8,1]{1,0} parameter(1)
  %p2 = f32[8,32]{1,0} parameter(2)
  ROOT %sc = f32[64,32]{1,0} scatter(%t, %p1, %p2), SCATTER_ATTRS
}

%f2 (p0: f32[32,64], p1: s32[8,1], p2: f32[8,32]) -> f32[64,32] {
  %p0 = f32[32,64]{1,0} parameter(0)
  %t = f32[64,32]{1,0} transpose(%p0), dimensions={1,0}
  %p1 = s32[8,1]{1,0} parameter(1)
  %p2 = f32[8,32]{1,0} parameter(2)
  ROOT %sc = f32[64,32]{1,0} scatter(%t, %p1, %p2), SCATTER_ATTRS
}

ENTRY %main (w: f32[32,64], idx: s32[8,1], upd: f32[8,32]) -> (f32[64,32], f32[64,32]) {
  %w = f32[32,64]{1,0} parameter(0)
  %idx = s32[8,1]{1,0} parameter(1)
  %upd = f32[8,32]{1,0} parameter(2)
  %a = f32[64,32]{1,0} fusion(%w, %idx, %upd), kind=kLoop, calls=%f1
  %b = f32[64,32]{1,0} fusion(%w, %idx, %upd), kind=kLoop, calls=%f2
  ROOT %out = (f32[64,32]{1,0}, f32[64,32]{1,0}) tuple(%a, %b)
}
""".replace("SCATTER_ATTRS", "update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
            "index_vector_dim=1, to_apply=%add")
F2 = TWO.index("%f2 (")


def _second(old: str, new: str) -> str:
    """TWO with one thing of f2 changed."""
    assert old in TWO[F2:]
    return TWO[:F2] + TWO[F2:].replace(old, new, 1)


@pytest.mark.parametrize("old,new", [
    ("%t = f32[64,32]{1,0} transpose", "%t = f32[64,32]{0,1} transpose"),  # layout: now a bitcast
    ("%p0 = f32[32,64]{1,0} parameter(0)\n  %t", "%p0 = f32[32,64]{0,1} parameter(0)\n  %t"),
    ("%t = f32[64,32]{1,0} transpose(%p0), dimensions={1,0}\n  %p1",
     "%t = f32[64,32]{1,0} reverse(%p0), dimensions={1,0}\n  %p1"),  # another op
    ("%p0 = f32[32,64]{1,0} parameter(0)\n  %t = f32[64,32]{1,0} transpose(%p0)",
     "%p0 = f32[32,64]{1,0} parameter(1)\n  %t = f32[64,32]{1,0} transpose(%p0)"),  # parameter numbers
])
def test_fusions_differing_in_one_thing_are_classified_each_as_itself(old, new):
    text = _second(old, new)
    if "parameter(1)\n  %t" in text:
        text = text[:F2] + text[F2:].replace("%p1 = s32[8,1]{1,0} parameter(1)", "%p1 = s32[8,1]{1,0} parameter(0)", 1)
        text = text.replace("%f2 (p0: f32[32,64], p1: s32[8,1]", "%f2 (p1: s32[8,1], p0: f32[32,64]").replace(
            "fusion(%w, %idx, %upd), kind=kLoop, calls=%f2", "fusion(%idx, %w, %upd), kind=kLoop, calls=%f2")
    fast, slow = _both(text)
    assert fast == slow
    def answer(name):  # a fusion's findings and decisions, its name left out
        return [[{k: v for k, v in f.items() if k != "fusion"} for f in fast[key] if f["fusion"] == name]
                for key in ("findings", "fusion_decisions")]

    a, b = answer("a"), answer("b")
    assert a != b  # the two fusions' answers differ: f2 was not given f1's
    a = a[0]
    assert a and a[0]["class"] == "hazard"


def test_fusions_of_one_structure_share_the_answer_with_their_own_names():
    fast, slow = _both(TWO)
    assert fast == slow
    assert [(f["fusion"], f["class"]) for f in fast["findings"]] == [("a", "hazard"), ("b", "hazard")]
    assert [(d["fusion"], d["scatter"], d["producer"]) for d in fast["fusion_decisions"]] == \
        [("a", "sc", "t (transpose)"), ("b", "sc", "t (transpose)")]


def test_transposes_differing_only_in_their_permutation_are_classified_each_as_itself():
    """Same shapes and layouts, dimensions={1,0} (a bitcast here) against {0,1} (moves the data)."""
    square = (TWO.replace("f32[32,64]", "f32[4,4]").replace("f32[64,32]", "f32[4,4]")
              .replace("f32[8,32]", "f32[8,4]").replace("%p0 = f32[4,4]{1,0} parameter(0)",
                                                        "%p0 = f32[4,4]{0,1} parameter(0)"))
    f2 = square.index("%f2 (")
    text = square[:f2] + square[f2:].replace("dimensions={1,0}", "dimensions={0,1}", 1)
    fast, slow = _both(text)
    assert fast == slow
    assert [(f["fusion"], f["class"]) for f in fast["findings"]] == [("a", "layout-preserving-miss"), ("b", "hazard")]
