"""tools/precision_diff.py: what the dots' precision changes in a compiled program. On records made
here from hand-written HLO (a planted change of graph caught, a change of precision and backend_config
alone masked) and on the committed libtpu compiles whose figures results/tpu-aot/README.md states."""

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def _record(folder: Path, change) -> None:
    """Rewrites the folder's one record with ``change`` applied to it."""
    record = json.loads((folder / "compile.jsonl").read_text())
    change(record)
    (folder / "compile.jsonl").write_text(json.dumps(record) + "\n")


def _gzipped(folder: Path, data: bytes) -> None:
    (folder / "hlo/m.txt").unlink()
    (folder / "hlo/m.txt.gz").write_bytes(data)


def _a_directory(folder: Path) -> None:
    (folder / "hlo/m.txt").unlink()
    (folder / "hlo/m.txt").mkdir()


BAD_RECORDS = {
    "hlo file missing": (lambda f: (f / "hlo/m.txt").unlink(), "hlo/m.txt: no such file (nor m.txt.gz)"),
    "hlo gz corrupt": (lambda f: _gzipped(f, b"not gzip"), "hlo/m.txt.gz: not gzip"),
    "hlo gz truncated": (lambda f: _gzipped(f, gzip.compress(HLO.encode())[:40]), "hlo/m.txt.gz: not gzip"),
    "hlo binary": (lambda f: (f / "hlo/m.txt").write_bytes(b"HloModule \xff\xfe"), "hlo/m.txt: not UTF-8 text"),
    "hlo a directory": (_a_directory, "hlo/m.txt: not a file"),
    "hlo an int": (lambda f: _record(f, lambda r: r.update(hlo=5)), "compile.jsonl:1: hlo is a number, not a string"),
    "options a list": (lambda f: _record(f, lambda r: r.update(options=["high"])),
                       "compile.jsonl:1: options is an array, not an object"),
    "fingerprint a string": (lambda f: _record(f, lambda r: r.update(fingerprint="5")),
                             "compile.jsonl:1: fingerprint is a string, not an object"),
    "no fingerprint.instructions": (lambda f: _record(f, lambda r: r["fingerprint"].pop("instructions")),
                                    "compile.jsonl:1: no fingerprint.instructions"),
    "fingerprint.temp_size_in_bytes a string": (
        lambda f: _record(f, lambda r: r["fingerprint"].update(temp_size_in_bytes="1 GB")),
        "compile.jsonl:1: fingerprint.temp_size_in_bytes is a string, not an integer"),
    "versions a list": (lambda f: _record(f, lambda r: r.update(versions=["j"])),
                        "compile.jsonl:1: versions is an array, not an object"),
    "compile.jsonl empty": (lambda f: (f / "compile.jsonl").write_text(""), "compile.jsonl: no compile records"),
    "compile.jsonl binary": (lambda f: (f / "compile.jsonl").write_bytes(b"\xff\n"),
                             "compile.jsonl: not UTF-8 text"),
}


@pytest.mark.parametrize("spoil,says", BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_a_bad_record_or_hlo_is_one_error_line_naming_it(tmp_path, capsys, spoil, says):
    tool = _tool()
    good = _folder(tmp_path, "good", "high", "1")
    spoil(_folder(tmp_path, "bad", "highest", "1"))
    assert tool.main([str(good), str(tmp_path / "bad")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith("error: ") and err.count("\n") == 1 and f"{tmp_path}/bad/{says}" in err, err
