"""libtpu's own aliasing decision (backend_config "aliasing_operands") read per instruction."""

import pytest

from xla_harness.hlo.compiler_alias import instruction_pairs, module_pairs, summary
from xla_harness.hlo.parser import parse_module

SCATTER_ATTRS = ("update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
                 "index_vector_dim=1, to_apply=%add")
F_CONFIG = '{"flag_configs":[],"aliasing_operands":{"lists":[{"indices":["0","3"]}]}}'
G_CONFIG = 'calls=%pair, backend_config={"aliasing_operands":{"lists":[{"indices":["2","4"]}]}}'

TPU_STYLE = '''HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

%inner (p0: f32[8,128], p1: s32[4,1], p2: f32[4,128]) -> f32[8,128] {
  %p0 = f32[8,128]{1,0:T(8,128)} parameter(0)
  %p1 = s32[4,1]{1,0:T(4,128)} parameter(1)
  %p2 = f32[4,128]{1,0:T(4,128)} parameter(2)
  ROOT %s = f32[8,128]{1,0:T(8,128)} scatter(%p0, %p1, %p2), SCATTER_ATTRS
}

%pair (q0: f32[8,128], q1: f32[8,128], q2: f32[8,128]) -> (f32[8,128], f32[8,128]) {
  %q0 = f32[8,128]{1,0:T(8,128)} parameter(0)
  %q1 = f32[8,128]{1,0:T(8,128)} parameter(1)
  %q2 = f32[8,128]{1,0:T(8,128)} parameter(2)
  %x = f32[8,128]{1,0:T(8,128)} add(%q0, %q1)
  %y = f32[8,128]{1,0:T(8,128)} multiply(%q2, %q1)
  ROOT %t = (f32[8,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) tuple(%x, %y)
}

ENTRY %main (w: f32[8,128], i: s32[4,1], u: f32[4,128], v: f32[8,128]) -> (f32[8,128], f32[8,128], f32[8,128]) {
  %w = f32[8,128]{1,0:T(8,128)} parameter(0)
  %i = s32[4,1]{1,0:T(4,128)} parameter(1)
  %u = f32[4,128]{1,0:T(4,128)} parameter(2)
  %v = f32[8,128]{1,0:T(8,128)} parameter(3)
  %f = f32[8,128]{1,0:T(8,128)} fusion(%w, %i, %u), kind=kCustom, calls=%inner, backend_config=F_CONFIG
  %g = (f32[8,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) fusion(%v, %w, %f), kind=kLoop, G_CONFIG
  %n = f32[8,128]{1,0:T(8,128)} negate(%v), backend_config={"aliasing_operands":{"lists":[]}}
  %g0 = f32[8,128]{1,0:T(8,128)} get-tuple-element(%g), index=0
  %g1 = f32[8,128]{1,0:T(8,128)} get-tuple-element(%g), index=1
  ROOT %o = (f32[8,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) tuple(%g0, %g1, %n)
}
'''.replace("SCATTER_ATTRS", SCATTER_ATTRS).replace("F_CONFIG", F_CONFIG).replace("G_CONFIG", G_CONFIG)


def _ins(module, name):
    return next(i for c in module.computations for i in c.instructions if i.name == name)


def test_operands_then_outputs():
    m = parse_module(TPU_STYLE)
    assert instruction_pairs(_ins(m, "f")) == [(0, ())]  # 3 operands: index 3 is the output
    assert instruction_pairs(_ins(m, "g")) == [(2, (1,))]  # 3 operands: index 4 is output 1 of the tuple
    assert instruction_pairs(_ins(m, "n")) == []  # the compiler says: nothing aliased
    assert instruction_pairs(_ins(m, "w")) is None  # says nothing at all


def test_module_summary_counts_scatter_fusions():
    m = parse_module(TPU_STYLE)
    assert [(p.instruction, p.operand, p.output_index) for p in module_pairs(m)] == [("f", 0, ()), ("g", 2, (1,))]
    assert summary(m) == {"instructions_with_field": 3, "aliased_fusions": 2, "aliased_scatter_fusions": 1}


def test_cpu_module_has_no_compiler_alias_field():
    m = parse_module(TPU_STYLE.replace('"aliasing_operands"', '"other"'))
    assert module_pairs(m) == [] and summary(m)["instructions_with_field"] == 0


def _scan(text):
    from xla_harness.hlo.scan import scan

    findings, _, _ = scan(parse_module(text), "tpu")
    return {f.fusion: f for f in findings}


def test_walk_and_compiler_agree_on_a_plain_scatter():
    f = _scan(TPU_STYLE)["f"]
    assert (f.cls, f.compiler, f.agreement) == ("aliased", "aliased", "agree")
    assert f.to_json()["agreement"] == "agree"


def test_compiler_that_declines_to_alias_disagrees():
    declined = TPU_STYLE.replace('"lists":[{"indices":["0","3"]}]', '"lists":[]')
    f = _scan(declined)["f"]
    assert (f.cls, f.compiler, f.agreement) == ("aliased", "not-aliased", "disagree")


def test_compiler_aliasing_through_a_transpose_is_the_reported_disagreement():
    """The #35409 form: the scatter's in-place operand is a data-moving transpose of the fusion's
    parameter, and the compiler still aliases that parameter with the output."""
    moved = TPU_STYLE.replace(
        '''%inner (p0: f32[8,128], p1: s32[4,1], p2: f32[4,128]) -> f32[8,128] {
  %p0 = f32[8,128]{1,0:T(8,128)} parameter(0)''',
        '''%inner (p0: f32[128,8], p1: s32[4,1], p2: f32[4,128]) -> f32[8,128] {
  %p00 = f32[128,8]{1,0:T(8,128)} parameter(0)
  %p0 = f32[8,128]{1,0:T(8,128)} transpose(%p00), dimensions={1,0}''').replace(
        "%w = f32[8,128]{1,0:T(8,128)} parameter(0)", "%w0 = f32[8,128]{1,0:T(8,128)} parameter(0)\n"
        "  %w = f32[128,8]{1,0:T(8,128)} transpose(%w0), dimensions={1,0}").replace(
        "fusion(%v, %w, %f)", "fusion(%v, %w0, %f)")
    f = _scan(moved)["f"]
    assert f.cls == "hazard" and f.compiler == "aliased" and f.agreement == "disagree"
    from xla_harness.hlo.scan import format_findings

    text = format_findings(parse_module(moved), list(_scan(moved).values()), backend="tpu")
    assert "writes in place through a data-moving op" in text


def _decisions(text):
    from xla_harness.hlo.scan import scan

    return scan(parse_module(text), "tpu")[1]


def _with_copy(src_layout: str, copy_layout: str) -> str:
    return TPU_STYLE.replace(
        '''%inner (p0: f32[8,128], p1: s32[4,1], p2: f32[4,128]) -> f32[8,128] {
  %p0 = f32[8,128]{1,0:T(8,128)} parameter(0)''',
        f'''%inner (p0: f32[8,128], p1: s32[4,1], p2: f32[4,128]) -> f32[8,128] {{
  %p00 = f32[8,128]{{{src_layout}}} parameter(0)
  %p0 = f32[8,128]{{{copy_layout}}} copy(%p00)''')


@pytest.mark.parametrize("src,dst,moves", [
    ("1,0:T(8,128)", "1,0:T(8,128)", False),  # same bytes: a copy that moves nothing
    ("1,0:T(8,128)", "1,0:T(8,128)S(1)", True),  # into another memory space
    ("1,0:T(8,128)", "1,0:T(2,128)", False),  # other tiles, same bytes (rows of 128 either way)
    ("1,0:T(8,128)", "1,0:T(8,64)", True),  # other tiles: other bytes
    ("1,0:T(8,128)", "0,1:T(8,128)", True),  # a physical transpose
])
def test_a_copy_feeding_a_scatter_moves_data_when_its_bytes_change(src, dst, moves):
    found = _decisions(_with_copy(src, dst))
    assert bool(found) is moves
    if moves:
        assert found[0].producer.endswith("(copy)")
