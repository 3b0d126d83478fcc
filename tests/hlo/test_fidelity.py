"""The comparison of two compiles fusion by fusion (xla_harness/hlo/fidelity.py), on a small module
as one compile made it (tests/data/fidelity_device.hlo) against copies of it with one difference
planted each: the table must call every planted difference, and nothing else, "no"."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_harness.hlo import fidelity
from xla_harness.hlo.parser import parse_module

DEVICE = (Path(__file__).resolve().parents[1] / "data" / "fidelity_device.hlo").read_text()
TILES = '"block_level_fusion_config":{"num_warps":"4","output_tiles":[{"sizes":["16","64"]}],"num_stages":3}'
GEMM = ('%gemm_fusion_dot.7 = f32[4,64]{1,0} fusion(f32[4,32]{1,0} %h, f32[64,32]{1,0} %w), kind=kCustom, '
        'calls=%gemm_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion",'
        + TILES + "}}")
CUBLAS = ('%cublas = (f32[4,64]{1,0}, s8[1024]{0}) custom-call(f32[4,32]{1,0} %h, f32[64,32]{1,0} %v), '
          'custom_call_target="__cublas$lt$matmul"')


def _differing(other: str) -> set[str]:
    f = fidelity.compare(parse_module(DEVICE, "device"), parse_module(other, "aot"))
    out = {aspect for aspect, _, _, same in f.rows if not same}
    matched, na, nb = f.matched_fusions
    if not matched == na == nb:
        out.add("fusions of the same content")
    out |= {f"tiles: {how}" for how, (same, held) in f.tiles.items() if same != held}
    return out


def _planted(old: str, new: str) -> str:
    assert DEVICE.count(old) == 1, old
    return DEVICE.replace(old, new)


def test_a_compile_against_itself_differs_in_nothing():
    assert _differing(DEVICE) == set()
    text = fidelity.format_fidelity(fidelity.compare(parse_module(DEVICE), parse_module(DEVICE)))
    assert "**no**" not in text
    assert ("| input_scatter_fusion: f32[64,32]{1,0}, in-place operand from loop_multiply_fusion (fusion native) "
            "| 1 | 1 |") in text


def test_names_and_numbering_are_not_compared():
    renamed = DEVICE.replace("loop_multiply_fusion.3", "loop_multiply_fusion.99").replace("%cublas", "%cc.1")
    assert _differing(renamed) == set()


@pytest.mark.parametrize("old,new,want", [
    # a fusion's content: multiply -> subtract inside the loop fusion
    ("ROOT %m = f32[64,32]{1,0} multiply(", "ROOT %m = f32[64,32]{1,0} subtract(",
     {"fusions of the same content"}),
    # the scatter's in-place operand comes from the parameter v, not from the loop fusion
    ("fusion(f32[64,32]{1,0} %loop_multiply_fusion.3, s32[8,1]", "fusion(f32[64,32]{1,0} %v, s32[8,1]",
     {"scatters and their in-place operands"}),
    # aliasing: one input_output_alias entry fewer
    (", {1}: (1, {}, may-alias) }", " }", {"input_output_alias entries", "input_output_alias", "aliased bytes"}),
    # sizes: one more argument
    ("  %upd = f32[8,32]{1,0} parameter(4)\n",
     "  %upd = f32[8,32]{1,0} parameter(4)\n  %more = f32[16]{0} parameter(5)\n",
     {"argument bytes", "instructions", "outside fusions: parameter"}),
    # the tile config the autotuner chose
    ('"num_stages":3', '"num_stages":1', {"tiles: Triton gemm"}),
])
def test_each_planted_difference_is_called_and_nothing_else(old, new, want):
    assert _differing(_planted(old, new)) == want


def test_dots_by_backend_cublas_against_a_triton_gemm_fusion():
    """The autotuner's choice: the device sends the dot to cuBLAS, ahead of time it is a Triton gemm fusion."""
    aot = _planted(CUBLAS + "\n  %logits = f32[4,64]{1,0} get-tuple-element((f32[4,64]{1,0}, s8[1024]{0}) %cublas), "
                   "index=0",
                   "%logits = f32[4,64]{1,0} fusion(f32[4,32]{1,0} %h, f32[64,32]{1,0} %v), kind=kCustom, "
                   "calls=%gemm_computation, backend_config={\"fusion_backend_config\":{\"kind\":"
                   "\"__triton_nested_gemm_fusion\"," + TILES + "}}")
    f = fidelity.compare(parse_module(DEVICE), parse_module(aot))
    rows = {aspect: (x, y) for aspect, x, y, _ in f.rows}
    assert rows["dots: cuBLAS"] == ("1", "0") and rows["dots: Triton gemm"] == ("1", "2")
    assert rows["dots in all"] == ("2", "2")
    assert rows["outside fusions: custom-call"] == ("1", "0")
    # the name each compile gives a content is matched first: the device's one gemm fusion is the
    # ahead-of-time gemm_fusion_dot, and the fusion that replaced cuBLAS has no counterpart
    assert ("gemm_fusion_dot", 1, 1, 1, 1) in f.fusion_rows and ("logits", 0, 1, 0, 0) in f.fusion_rows
    # a native-emitter gemm fusion (no Triton kind in its backend config) counts as native
    native = _planted(GEMM, GEMM.split(", backend_config=")[0])
    rows = {aspect: (x, y) for aspect, x, y, _ in fidelity.compare(parse_module(DEVICE), parse_module(native)).rows}
    assert rows["dots: native"] == ("0", "1") and rows["dots: Triton gemm"] == ("1", "0")


def test_a_fusion_only_one_compile_has_is_named_in_the_fusion_rows():
    extra = _planted("  ROOT %out = ", "  %wrapped_transpose.1 = f32[32,64]{1,0} fusion(f32[64,32]{1,0} %w), "
                     "kind=kLoop, calls=%t_comp\n  ROOT %out = ")
    extra = extra.replace("ENTRY %main", "%t_comp (q: f32[64,32]) -> f32[32,64] {\n"
                          "  %q = f32[64,32]{1,0} parameter(0)\n"
                          "  ROOT %tr = f32[32,64]{1,0} transpose(f32[64,32]{1,0} %q), dimensions={1,0}\n"
                          "}\n\nENTRY %main")
    f = fidelity.compare(parse_module(extra), parse_module(DEVICE))
    assert ("wrapped_transpose", 1, 0, 0, 0) in f.fusion_rows
    assert "| wrapped_transpose | 1 | 0 | 0 | 0 |" in fidelity.format_fidelity(f)
    assert {"fusions", "instructions", "fusions emitted by native"} <= {a for a, _, _, same in f.rows if not same}


def test_array_bytes_counts_every_leaf():
    from xla_harness.hlo.shapes import parse_shape

    assert fidelity.array_bytes(parse_shape("(f32[4,64]{1,0}, s8[1024]{0}, pred[3], bf16[2,2], s4[3])")[0]) \
        == 1024 + 1024 + 3 + 8 + 2


def _compile_folder(where: Path, text: str, temp: int) -> Path:
    import json

    (where / "hlo").mkdir(parents=True)
    (where / "hlo" / "m.after_optimizations.txt").write_text(text)
    record = {"kind": "compile", "label": "issue-35409", "options": {}, "target": "cuda:h200:1x1x1",
              "device_kind": "NVIDIA H200", "versions": {"jax": "0.11.2"}, "XLA_FLAGS": "", "compile_cpu_s": 1.0,
              "fingerprint": {"id": "f", "instructions": 1, "temp_size_in_bytes": temp},
              "scan": {"backend": "gpu", "hazard": 0, "decisions": 0, "aliased": 0, "layout-preserving-miss": 0}}
    (where / "compile.jsonl").write_text(json.dumps(record) + "\n")
    return where


def test_the_make_target_tool_writes_the_table(tmp_path, capsys):
    """tools/gpu_fidelity.py (make gpu-fidelity) on two compile-only folders: the table and its data."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gpu_fidelity", Path(__file__).resolve().parents[2] / "tools"
                                                  / "gpu_fidelity.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    device = _compile_folder(tmp_path / "device", DEVICE, 100)
    aot = _compile_folder(tmp_path / "aot", _planted('"num_stages":3', '"num_stages":1'), 90)
    assert tool.main(["--device", str(device), "--aot", str(aot), "--out", str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| temp bytes (buffer assignment) | 100 | 90 |" in table
    assert "| Triton gemm fusions held by both with the same tile config | 0 of 1 | | **no** |" in table
    data = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert data["tiles"] == {"Triton gemm": [0, 1]} and data["matched_fusions"] == [3, 3, 3]
    capsys.readouterr()
    assert tool.main(["--device", str(tmp_path / "none"), "--aot", str(aot), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "no compile.jsonl" in err
