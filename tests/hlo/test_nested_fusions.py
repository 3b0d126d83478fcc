"""The fusion-decision walk follows nested fusions, as libtpu prints them: each scatter at the root
of a kCustom fusion inside a kLoop fusion, its in-place operand coming from the outer fusion's
parameter through a data-moving op in the outer computation or inside a nested kLoop fusion."""

import pytest

from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.scan import scan

SCATTER = ("update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
           "index_vector_dim=1, to_apply=%add")


def module(producer: str, nested_loop: bool) -> str:
    """W^T (or W) reaches a nested scatter fusion's in-place operand. ``producer`` is the op applied to
    the outer parameter (f32[128,8] -> f32[8,128]); ``nested_loop`` puts it inside a nested kLoop fusion."""
    feed = "%l = f32[8,128]{1,0} fusion(%w), kind=kLoop, calls=%loop" if nested_loop else \
        f"%l = f32[8,128]{{1,0}} {producer}"
    return f'''HloModule m

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}}

%loop (q: f32[128,8]) -> f32[8,128] {{
  %q = f32[128,8]{{1,0}} parameter(0)
  ROOT %t = f32[8,128]{{1,0}} {producer.replace("%w", "%q")}
}}

%scatter_comp (s0: f32[8,128], s1: s32[4,1], s2: f32[4,128]) -> f32[8,128] {{
  %s0 = f32[8,128]{{1,0}} parameter(0)
  %s1 = s32[4,1]{{1,0}} parameter(1)
  %s2 = f32[4,128]{{1,0}} parameter(2)
  ROOT %sc = f32[8,128]{{1,0}} scatter(%s0, %s1, %s2), {SCATTER}
}}

%outer (w: f32[128,8], i: s32[4,1], u: f32[4,128]) -> f32[8,128] {{
  %w = f32[128,8]{{1,0}} parameter(0)
  %i = s32[4,1]{{1,0}} parameter(1)
  %u = f32[4,128]{{1,0}} parameter(2)
  {feed}
  ROOT %n = f32[8,128]{{1,0}} fusion(%l, %i, %u), kind=kCustom, calls=%scatter_comp
}}

ENTRY %main (p: f32[128,8], idx: s32[4,1], upd: f32[4,128]) -> f32[8,128] {{
  %p = f32[128,8]{{1,0}} parameter(0)
  %idx = s32[4,1]{{1,0}} parameter(1)
  %upd = f32[4,128]{{1,0}} parameter(2)
  ROOT %f = f32[8,128]{{1,0}} fusion(%p, %idx, %upd), kind=kLoop, calls=%outer
}}
'''


TRANSPOSE = "transpose(%w), dimensions={1,0}"


@pytest.mark.parametrize("nested_loop", [False, True])
def test_transpose_of_the_outer_parameter_feeding_a_nested_scatter_fusion(nested_loop):
    _, decisions, _ = scan(parse_module(module(TRANSPOSE, nested_loop)), "tpu")
    [d] = decisions
    assert (d.fusion, d.scatter, d.parameter) == ("f", "sc", 0)
    assert d.producer.endswith("(transpose)")
    assert d.path.count("fusion") == (1 if nested_loop else 0)


@pytest.mark.parametrize("nested_loop", [False, True])
def test_a_bitcast_on_the_way_is_not_a_finding(nested_loop):
    bitcast = "bitcast(%w)"
    _, decisions, _ = scan(parse_module(module(bitcast, nested_loop)), "tpu")
    assert decisions == []


def test_the_nested_scatter_is_reported_once():
    _, decisions, _ = scan(parse_module(module(TRANSPOSE, True)), "tpu")
    assert len(decisions) == 1
