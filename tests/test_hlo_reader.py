"""The HLO reader against XLA's own parser (jaxlib): same verdict, same structure."""

import pytest

from harness.hlo.parser import HloParseError, parse_module

BASE = """HloModule m

ENTRY e {
  p0 = f32[2,3]{1,0} parameter(0)
  p1 = f32[2,3]{1,0} parameter(1)
  ROOT a = f32[2,3]{1,0} add(%p0, p1)
}
"""

THREADED = """HloModule m

c {
  p = f32[] parameter(0)
  ROOT n = f32[] negate(p)
}, execution_thread="other"

ENTRY e {
  p0 = f32[] parameter(0)
  t = (f32[], f32[]) tuple(%p0, p0)
  ROOT x = f32[] get-tuple-element(t), index=1
} // e
"""

CASES = {
    "mixed_percent_and_bare_operands": BASE,
    "execution_thread_and_trailing_comment": THREADED,
    "two_roots": BASE.replace("  p1 =", "  ROOT p1 ="),
    "undefined_operand": BASE.replace("add(%p0, p1)", "add(%p0, q)"),
    "duplicate_instruction_name": BASE.replace("p1 = f32[2,3]{1,0} parameter(1)",
                                               "p0 = f32[2,3]{1,0} parameter(1)"),
    "duplicate_computation_name": THREADED.replace("ENTRY e {", "c {").replace("} // e", "}"),
}


def _xla_accepts(text: str) -> str | None:
    """XLA's reprint of the module, or None when XLA's parser rejects it."""
    from jax._src.lib import hlo as xla_hlo

    try:
        return xla_hlo.hlo_module_from_text(text).to_string()
    except Exception:  # noqa: BLE001 - any rejection by XLA counts
        return None


def _structure(text: str):
    mod = parse_module(text)
    return [(c.name, c.root.name,
             [(i.name, i.opcode, str(i.shape), list(i.operands)) for i in c.instructions])
            for c in mod.computations]


def _ours_accepts(text: str) -> bool:
    try:
        parse_module(text)
    except HloParseError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_verdict_and_structure_as_xla(name):
    text = CASES[name]
    reprint = _xla_accepts(text)
    assert _ours_accepts(text) == (reprint is not None)
    if reprint is not None:
        assert _structure(text) == _structure(reprint)
