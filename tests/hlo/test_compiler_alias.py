"""The compiler's own aliasing decision: libtpu's backend_config "aliasing_operands" read per instruction,
and the GPU compiler's buffer assignment (one slice for an in-place operand and the fusion's output)."""

from pathlib import Path

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


# ----------------------------------------------------------------------------- the GPU compiler: buffer slices

HLO = Path(__file__).parent


def _gpu_ba(fusion_alloc: int, fusion_offset: int, fusion_size: int = 8192, values: str | None = None):
    """A GPU-style buffer assignment for the hand-written fixtures: ``w`` in allocation 0 at offset 0,
    the fusion's output where asked; with ``values`` the values file's uses too."""
    from xla_harness.hlo import buffers

    fusion = f" value: <5 fusion @0> (size={fusion_size},offset={fusion_offset}): f32[64,32]{{1,0}}\n"
    text = ("BufferAssignment:\n"
            "allocation 0: size 16384, parameter 0, shape |f32[32,64]| at ShapeIndex {}, maybe-live-out:\n"
            " value: <0 w @0> (size=8192,offset=0): f32[32,64]{1,0}\n"
            " value: <1 b @0> (size=8192,offset=8192): f32[64,32]{1,0}\n"
            + (fusion if fusion_alloc == 0 else "allocation 1: size 16384, maybe-live-out:\n" + fusion))
    ba = buffers.parse_buffer_assignment(text, "ba.txt")
    if values is not None:
        ba.uses = buffers.parse_value_uses(values, "values.txt")
    return ba


def _gpu_scan(name: str, ba):
    from xla_harness.hlo.scan import scan

    mod = parse_module((HLO / name).read_text(), name)
    (f,) = scan(mod, "gpu", ba)[0]
    return f


def test_buffer_assignment_same_slice_is_the_compilers_in_place_pair():
    f = _gpu_scan("operand_is_parameter.hlo", _gpu_ba(0, 0))
    assert (f.cls, f.compiler, f.compiler_from, f.agreement) == ("aliased", "aliased", "buffer assignment", "agree")
    assert f.to_json()["compiler_from"] == "buffer assignment"


@pytest.mark.parametrize("alloc,offset,size", [(1, 0, 8192), (0, 8192, 8192), (0, 0, 4096)])
def test_buffer_assignment_other_slice_disagrees_with_the_walk(alloc, offset, size):
    """Another allocation, another offset, or the same start but another size: not one slice, so the
    GPU compiler did not write in place where the walk pairs the output (the planted disagreement)."""
    f = _gpu_scan("operand_is_parameter.hlo", _gpu_ba(alloc, offset, size))
    assert (f.cls, f.compiler, f.agreement) == ("aliased", "not-aliased", "disagree")


def test_buffer_assignment_that_aliases_a_hazard_is_the_reported_disagreement():
    """transpose_moves_data: the walk says in-place here would overwrite what the transpose still reads;
    a buffer assignment giving ``w`` and the fusion one slice is the compiler doing just that."""
    f = _gpu_scan("transpose_moves_data.hlo", _gpu_ba(0, 0))
    assert (f.cls, f.compiler, f.agreement) == ("hazard", "aliased", "disagree")
    f = _gpu_scan("transpose_moves_data.hlo", _gpu_ba(1, 0))
    assert (f.cls, f.compiler, f.agreement) == ("hazard", "not-aliased", "agree")


def test_values_file_uses_name_the_value_each_operand_reads():
    """With the values file the operand's value is the compiler's (here ``b``, another slice, although
    the operand is printed as ``w``); without it the value named ``w`` is read."""
    values = """Used values:
<0 w @0>
 positions:
  w
 uses:
  logits, operand 1
<1 b @0>
 positions:
  b
 uses:
  fusion, operand 0
 from instruction: %b = f32[64,32]{1,0} parameter(0)
"""
    assert _gpu_scan("transpose_moves_data.hlo", _gpu_ba(0, 0)).compiler == "aliased"
    f = _gpu_scan("transpose_moves_data.hlo", _gpu_ba(0, 0, values=values))
    assert (f.compiler, f.agreement) == ("not-aliased", "agree")
    f = _gpu_scan("transpose_moves_data.hlo", _gpu_ba(0, 8192, values=values))
    assert (f.compiler, f.agreement) == ("aliased", "disagree")


def test_operand_found_through_bitcast_and_get_tuple_element_without_values_file():
    from xla_harness.hlo import buffers
    from xla_harness.hlo.scan import scan

    text = (HLO / "operand_is_parameter.hlo").read_text().replace(
        "ROOT %fusion = f32[64,32]{1,0} fusion(f32[64,32]{1,0} %w,",
        "%t = (f32[64,32]{1,0}, f32[64,32]{1,0}) tuple(%w, %w)\n"
        "  %g = f32[64,32]{1,0} get-tuple-element(%t), index=1\n"
        "  %c = f32[64,32]{1,0} bitcast(%g)\n"
        "  ROOT %fusion = f32[64,32]{1,0} fusion(f32[64,32]{1,0} %c,")
    mod = parse_module(text)
    ba_text = """BufferAssignment:
allocation 0: size 8192, maybe-live-out:
 value: <0 t{1} @0> (size=8192,offset=0): f32[64,32]{1,0}
 value: <5 fusion @0> (size=8192,offset=0): f32[64,32]{1,0}
"""
    (f,) = scan(mod, "gpu", buffers.parse_buffer_assignment(ba_text))[0]
    assert (f.compiler, f.agreement) == ("aliased", "agree")
    (f,) = scan(mod, "gpu", buffers.parse_buffer_assignment(ba_text.replace("t{1}", "t{0}")))[0]
    assert f.compiler == ""  # the value the operand reads is not listed: no verdict, not "not-aliased"


def test_a_fusion_the_assignment_does_not_list_gets_no_verdict():
    from xla_harness.hlo import buffers

    ba = buffers.parse_buffer_assignment("allocation 0: size 4:\n value: <0 w @0> (size=4,offset=0): f32[]\n")
    f = _gpu_scan("operand_is_parameter.hlo", ba)
    assert (f.compiler, f.agreement) == ("", "") and "compiler" not in f.to_json()


def test_values_file_that_is_not_one_is_refused():
    from xla_harness.errors import HarnessError
    from xla_harness.hlo import buffers

    with pytest.raises(HarnessError, match="values.txt:1: no '<id name @color>' lines"):
        buffers.parse_value_uses("BufferAssignment:\nallocation 0: size 4:\n", "values.txt")
    with pytest.raises(HarnessError, match="values.txt:1: 'uses:' before"):
        buffers.parse_value_uses(" uses:\n  f, operand 0\n", "values.txt")


def test_dump_directory_reads_the_values_file_beside_the_assignment(tmp_path):
    from xla_harness.hlo import buffers

    ba = tmp_path / "m.gpu_after_optimizations-buffer-assignment.txt"
    ba.write_text("allocation 0: size 4:\n value: <0 w @0> (size=4,offset=0): f32[]\n")
    assert buffers.load_buffer_assignment(ba).uses is None
    buffers.values_path(ba).write_text("<0 w @0>\n uses:\n  f, operand 2 {1}\n")
    assert buffers.load_buffer_assignment(ba).uses == {("f", 2, (1,)): 0}
