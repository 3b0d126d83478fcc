"""tools/precision_diff.py: what the dots' precision changes in a compiled program. On records made
here from hand-written HLO (a planted change of graph caught, a change of precision and backend_config
alone masked) and on the committed libtpu compiles whose figures results/tpu-aot/README.md states."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "results/tpu-aot/sweep"


def _tool():
    if str(ROOT / "tools") not in sys.path:  # the tool imports aliased_writes beside it
        sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location("precision_diff", ROOT / "tools/precision_diff.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HLO = """HloModule m, entry_computation_layout={(f32[4,4]{1,0}, f32[4,4]{1,0})->f32[4,4]{1,0}}

ENTRY %main (a: f32[4,4], b: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0), metadata={op_name="a"}
  %b = f32[4,4]{1,0} parameter(1)
  %c = bf16[4,4]{1,0} convert(%a)
  %conv = f32[4,4]{1,0} convolution(%a, %b), dim_labels=bf_io->bf, PRECISION, metadata={op_name="dot"}
  ROOT %f = f32[4,4]{1,0} fusion(%conv, OPERAND), kind=kLoop, calls=%x, \
backend_config={"window_config":{"estimated_cycles":"CYCLES","s":"a \\"}\\" b"}}
}
"""


def _folder(tmp: Path, name: str, precision: str, cycles: str, operand: str = "%b") -> Path:
    folder = tmp / name
    (folder / "hlo").mkdir(parents=True)
    text = (HLO.replace("PRECISION", f"operand_precision={{{precision},{precision}}}" if precision else "")
            .replace("CYCLES", cycles).replace("OPERAND", operand))
    (folder / "hlo/m.txt").write_text(text)
    record = {"hlo": "hlo/m.txt", "options": {"precision": precision or "default"}, "versions": {"jax": "j"},
              "fingerprint": {"instructions": 5, "temp_size_in_bytes": 10**9}}
    (folder / "compile.jsonl").write_text(json.dumps(record) + "\n")
    return folder


def _rows(capsys) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()[2:]]


def test_a_change_of_precision_and_lowering_alone_is_the_same_graph(tmp_path, capsys):
    tool = _tool()
    high = _folder(tmp_path, "high", "high", "100")
    highest = _folder(tmp_path, "highest", "highest", "9223372036854775807")
    assert tool.main([str(high), str(highest)]) == 0
    rows = _rows(capsys)
    assert rows[0][1:7] == ["high", "5", "1.00 GB", "1 (1 {high,high})", "1", "100 (0)"]
    assert rows[1][6:] == ["0 (1)", "2", "0"]  # the dot's line and the fusion's differ; masked, none


def test_a_planted_change_of_graph_is_caught(tmp_path, capsys):
    tool = _tool()
    high = _folder(tmp_path, "high", "high", "100")
    moved = _folder(tmp_path, "moved", "highest", "100", operand="%a")
    assert tool.main([str(high), str(moved)]) == 0
    assert _rows(capsys)[1][7:] == ["2", "1"]


def test_backend_config_is_cut_whole_even_with_braces_in_its_strings():
    tool = _tool()
    line = 'x = f32[] fusion(a), backend_config={"k":"a \\"}\\" b","n":{"m":1}}, other=2'
    assert tool._without_backend_config(line) == "x = f32[] fusion(a), other=2"


@pytest.mark.parametrize("argv,says", [([], "usage"), (["{tmp}/none"], "is not a file"),
                                       (["{tmp}/high@2"], "has records 1 to 1"), (["{tmp}/high@x"], "records 1 to 1")])
def test_bad_input_is_one_error_line(tmp_path, capsys, argv, says):
    tool = _tool()
    _folder(tmp_path, "high", "high", "1")
    assert tool.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1


@pytest.mark.parametrize("pin,default,high,highest", [
    ("jax0.12.0.1", ("25,121", "10.36 GB", "282,374,567 (4)"), ("24,935", "14.38 GB", "331,023,188 (4)"),
     ("24,935", "14.38 GB", "421,339,046 (4)")),
    ("jax0.9.0.1", ("34,988", "5.98 GB", "288,640,940 (0)"), ("34,623", "9.52 GB", "330,449,825 (0)"),
     ("34,623", "9.52 GB", "419,434,421 (0)")),
])
def test_the_committed_precision_compiles_say_what_the_readme_says(capsys, pin, default, high, highest):
    tool = _tool()
    assert tool.main([str(ROOT / f"results/tpu-aot/report/{pin}@1"), str(SWEEP / f"precision=high/{pin}"),
                      str(SWEEP / f"precision=highest/{pin}")]) == 0
    rows = _rows(capsys)
    assert [r[1] for r in rows] == ["default", "high", "highest"]
    for row, (instructions, temp, cycles) in zip(rows, (default, high, highest), strict=True):
        assert (row[2], row[3], row[6]) == (instructions, temp, cycles)
        assert row[4] == "426 (426 " + {"default": "none", "high": "{high,high}",
                                        "highest": "{highest,highest}"}[row[1]] + ")"
    assert [r[5] for r in rows] == ["29", "3", "3"]
    assert rows[2][7:] == ["852", "0"]  # high -> highest: the same graph
    assert int(rows[1][8]) > 1000  # default -> high: another program
