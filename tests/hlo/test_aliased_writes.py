"""Where W's scatter writes (xla_harness.hlo.tied.aliased_scatter_writes, tools/aliased_writes.py):
on a hand-written module with one producer of each kind, and on libtpu's own compiles committed in
results/tpu-aot/sweep, whose README column it must reproduce."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.tied import aliased_scatter_writes

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "results/tpu-aot/sweep"


def _tool():
    spec = importlib.util.spec_from_file_location("aliased_writes", ROOT / "tools/aliased_writes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_producer_of_an_aliased_scatter_buffer_is_named():
    module = parse_module((ROOT / "tests/data/aliased_scatter_writes.hlo").read_text(), "fixture")
    writes = aliased_scatter_writes(module, (64, 32))
    assert [(w.fusion, w.producer, w.source, w.via_tuple) for w in writes] == [
        ("onto_dense", "dense", "dense", True),
        ("onto_zeros", "zeros", "broadcast", False),
        ("onto_masked", "masked", "select-broadcast", False),
        ("onto_moved", "moved", "data-moving", False),
        ("onto_summed", "summed", "dense-via", False),
    ]
    assert [w.text for w in writes] == [
        "the dense (dot) gradient's fusion (via a get-tuple-element)", "a broadcast zero",
        "a select of a broadcast zero (kLoop)", "a transpose (moves data)",
        "the dense (dot) gradient, via a kLoop fusion (root add) after collective-permute"]
    # W's shape in the other order is W's shape; another shape is not.
    assert len(aliased_scatter_writes(module, (32, 64))) == 5
    assert aliased_scatter_writes(module, (64, 16)) == []


# The sweep README's column "where the aliased scatter writes", for three cells that between them
# hold every answer it gives.
COMMITTED = [
    ("jit=bare/jax0.12.0.1", "the dense (dot) gradient's fusion"),
    ("embed_spec=model,none/jax0.12.0.1", "a select of a broadcast zero (kLoop); a broadcast zero"),
    ("embed_spec=none,data/jax0.9.0.1",
     "the dense (dot) gradient's fusion (via a get-tuple-element); a broadcast zero"),
]


@pytest.mark.parametrize("cell, words", COMMITTED)
def test_libtpus_compiles_read_as_the_sweep_readme_says(cell, words):
    tool = _tool()
    folder = SWEEP / cell
    (record,) = [json.loads(line) for line in (folder / "compile.jsonl").read_text().splitlines()]
    assert tool.where_written(folder, record) == words
    readme = (ROOT / "results/tpu-aot/README.md").read_text()
    option, pin = cell.split("/")
    versions = "0.12.0.1 / 0.0.50.1" if pin == "jax0.12.0.1" else "0.9.0.1 / 0.0.34"
    assert any(line.startswith(f"| {versions} | {option} |") and line.endswith(f"| {words} |")
               for line in readme.splitlines())


def test_the_tool_prints_a_row_per_record_and_refuses_bad_input(tmp_path, capsys):
    tool = _tool()
    assert tool.main([str(SWEEP / "jit=bare/jax0.12.0.1"), str(SWEEP / "jit=nested/jax0.12.0.1")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| jax / libtpu | jit | instructions |") and len(out) == 4
    assert out[2] == ("| 0.12.0.1 / 0.0.50.1 | bare | 24,644 | 10.36 GB / 1.92 GB | 157 | 0 / 0 | 97 (1) | 0 | "
                      "the dense (dot) gradient's fusion |")
    (tmp_path / "compile.jsonl").write_text('{"kind": "compile"}\n')
    for argv, says in (([], "usage"), ([str(tmp_path / "nowhere")], "is not a file"),
                       ([str(tmp_path)], "compile.jsonl:1: not a compile record"), (["--factors"], "--factors")):
        assert tool.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and says in err[0], err


UNALIASED = (ROOT / "tests/data/unaliased_scatters.hlo").read_text()


def test_where_no_scatter_fusion_is_aliased_the_tool_says_where_the_scatters_add(tmp_path, monkeypatch):
    tool = _tool()
    monkeypatch.setattr(tool, "w_shard", lambda options: (64, 32))
    (tmp_path / "m.hlo").write_text(UNALIASED)
    record = {"hlo": "m.hlo", "label": "fixture", "options": {}}
    assert tool.where_written(tmp_path, record) == (
        "no aliased scatter fusion (2 scatters of W's shape: 1 into broadcast zeros, 1 into the dense gradient)")
    # The same module with the second fusion aliased: the column names its buffer instead.
    (tmp_path / "m.hlo").write_text(UNALIASED.replace('calls=%scatter_param, backend_config={"aliasing_operands":'
                                                      '{"lists":[]}}', 'calls=%scatter_param, backend_config='
                                                      '{"aliasing_operands":{"lists":[{"indices":["0","3"]}]}}'))
    assert tool.where_written(tmp_path, record) == "a dot"


# ----------------------------------------------------------------------------- bad input: one error line, exit 2

FIXTURE = (ROOT / "tests/data/aliased_scatter_writes.hlo").read_text()


def _good_record() -> dict:
    """A record with every field a row reads, its HLO the hand-written fixture (m.hlo)."""
    return {"hlo": "m.hlo", "label": "fixture", "options": {"jit": "bare", "embed_spec": "model,data"},
            "fingerprint": {"instructions": 24644, "temp_size_in_bytes": 10 ** 9, "alias_size_in_bytes": 10 ** 8},
            "compile_cpu_s": 157.0, "versions": {"jax": "0.12.0.1", "libtpu": "0.0.50.1"},
            "scan": {"hazard": 0, "decisions": 0,
                     "compiler_alias": {"aliased_fusions": 5, "aliased_scatter_fusions": 5, "disagreements": 0}}}


def _folder(tmp_path: Path, record: dict, hlo: str | bytes | None = FIXTURE) -> Path:
    (tmp_path / "compile.jsonl").write_text(json.dumps(record) + "\n")
    if isinstance(hlo, str):
        (tmp_path / "m.hlo").write_text(hlo)
    elif isinstance(hlo, bytes):
        (tmp_path / "m.hlo").write_bytes(hlo)
    return tmp_path


def _as_command(tool, argv: list[str], capsys) -> tuple[int, str, str]:
    """``python tools/aliased_writes.py ARGV`` as the interpreter runs it: an exception out of main is a
    traceback on stderr and exit 1."""
    import traceback

    capsys.readouterr()
    try:
        code = tool.main(argv)
        tb = ""
    except Exception:  # noqa: BLE001 - what the interpreter would print
        code, tb = 1, traceback.format_exc()
    captured = capsys.readouterr()
    return code, captured.out, captured.err + tb


def _assert_refused(code: int, out: str, err: str, says: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], (code, err)
    assert out == "", out  # no half table


def _with(dotted: str, value: object):
    def edit(record: dict) -> None:
        *parents, key = dotted.split(".")
        for p in parents:
            record = record[p]
        if value is _with:
            del record[key]
        else:
            record[key] = value
    return edit


MISSING = _with  # as a value: delete the field

ONE_ALIASED = 'backend_config={"aliasing_operands":{"lists":[{"indices":["0","3"]}]}}'
GATHER_WITHOUT_OPERANDS = ("HloModule m\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  %p = f32[4] parameter(0)\n"
                           "  ROOT %g = f32[4] gather(), offset_dims={0}, slice_sizes={1}\n}\n")

# name: (edit of the record, the HLO file's content (None: no file; a callable: made in the folder), says)
BAD_TABLE_INPUT = {
    "hlo garbage text": (None, "hello, this is not HLO\n", "m.hlo:1: expected 'HloModule"),
    "hlo binary": (None, bytes(range(256)) * 4, "m.hlo: not UTF-8 text"),
    "hlo empty": (None, "", "m.hlo:1: empty file"),
    "hlo truncated": (None, FIXTURE[:len(FIXTURE) // 2], "truncated module"),
    "hlo missing": (None, None, "m.hlo: no such file"),
    "hlo a directory": (None, lambda d: (d / "m.hlo").mkdir(), "m.hlo: not a file"),
    "hlo.gz not gzip": (None, lambda d: (d / "m.hlo.gz").write_bytes(b"plain text"), "m.hlo.gz: not gzip"),
    "hlo.gz truncated": (None, lambda d: (d / "m.hlo.gz").write_bytes(gzip.compress(FIXTURE.encode())[:200]),
                         "m.hlo.gz: not gzip"),
    "hlo.gz binary": (None, lambda d: (d / "m.hlo.gz").write_bytes(gzip.compress(bytes(range(256)))),
                      "m.hlo.gz: not UTF-8 text"),
    "hlo name empty": (_with("hlo", " "), None, 'hlo is " ", not a file name'),
    "hlo name with NUL": (_with("hlo", "m\0.hlo"), None, "not a file name"),
    "compile.jsonl a directory": (lambda r: None, lambda d: ((d / "compile.jsonl").unlink(),
                                                             (d / "compile.jsonl").mkdir()), "is not a file"),
    "scan missing": (_with("scan", MISSING), FIXTURE, "compile.jsonl:1: no scan"),
    "scan an array": (_with("scan", []), FIXTURE, "scan is an array, not an object"),
    "scan.hazard a string": (_with("scan.hazard", "1"), FIXTURE, 'scan.hazard is "1", not an integer'),
    "scan.decisions null": (_with("scan.decisions", None), FIXTURE, "scan.decisions is null, not an integer"),
    "compiler_alias an array": (_with("scan.compiler_alias", [1]), FIXTURE, "scan.compiler_alias is an array"),
    "aliased_fusions an object": (_with("scan.compiler_alias.aliased_fusions", {}), FIXTURE,
                                  "scan.compiler_alias.aliased_fusions is an object, not an integer"),
    "disagreements a boolean": (_with("scan.compiler_alias.disagreements", True), FIXTURE,
                                "disagreements is a boolean"),
    "compile_cpu_s missing": (_with("compile_cpu_s", MISSING), FIXTURE, "no compile_cpu_s"),
    "compile_cpu_s a string": (_with("compile_cpu_s", "157"), FIXTURE, 'compile_cpu_s is "157", not a number'),
    "instructions missing": (_with("fingerprint.instructions", MISSING), FIXTURE, "no fingerprint.instructions"),
    "instructions a string": (_with("fingerprint.instructions", "24644"), FIXTURE, "not an integer"),
    "temp size missing": (_with("fingerprint.temp_size_in_bytes", MISSING), FIXTURE,
                          "no fingerprint.temp_size_in_bytes"),
    "alias size an array": (_with("fingerprint.alias_size_in_bytes", [1]), FIXTURE,
                            "fingerprint.alias_size_in_bytes is an array, not a number"),
    "versions an array": (_with("versions", []), FIXTURE, "versions is an array, not an object"),
    "versions.libtpu a number": (_with("versions.libtpu", 50), FIXTURE, "versions.libtpu is a number"),
    "embed_spec one axis": (_with("options.embed_spec", "model"), FIXTURE, 'options.embed_spec is "model"'),
    "embed_spec an unknown axis": (_with("options.embed_spec", "x,data"), FIXTURE, "options.embed_spec"),
    "embed_spec a number": (_with("options.embed_spec", 2), FIXTURE, "options.embed_spec is a number"),
    "fingerprint missing": (_with("fingerprint", MISSING), FIXTURE, "not a compile record"),
    "backend_config not JSON": (None, FIXTURE.replace(ONE_ALIASED, 'backend_config={aliasing_operands: 0}', 1),
                                "onto_dense's backend_config names aliasing_operands but is not JSON"),
    "aliasing lists not an array": (None, FIXTURE.replace(ONE_ALIASED, 'backend_config={"aliasing_operands":'
                                                                       '{"lists":"0,3"}}', 1), "is not {"),
    "aliasing indices not integers": (None, FIXTURE.replace(ONE_ALIASED, 'backend_config={"aliasing_operands":'
                                                                         '{"lists":[{"indices":["x"]}]}}', 1),
                                      "indices [\"x\"] are not non-negative integers"),
    "aliasing index negative": (None, FIXTURE.replace(ONE_ALIASED, 'backend_config={"aliasing_operands":'
                                                                   '{"lists":[{"indices":[-1, 3]}]}}', 1),
                                "are not non-negative integers"),
    "a gather without operands": (None, GATHER_WITHOUT_OPERANDS, "m.hlo: not a module the column can be read from"),
}


def test_the_good_record_of_the_cases_below_gives_a_row(tmp_path, capsys):
    tool = _tool()
    code, out, err = _as_command(tool, [str(_folder(tmp_path, _good_record()))], capsys)
    assert code == 0 and err == "", err
    assert out.splitlines()[2].startswith("| 0.12.0.1 / 0.0.50.1 | 24,644 | 1.00 GB / 0.10 GB | 157 | 0 / 0 | 5 (5) |")


def _plant(tmp_path: Path, name: str) -> Path:
    edit, hlo, _ = BAD_TABLE_INPUT[name]
    record = _good_record()
    if edit is not None:
        edit(record)
    folder = _folder(tmp_path, record, hlo if not callable(hlo) else FIXTURE)
    if callable(hlo):
        (folder / "m.hlo").unlink()
        hlo(folder)
    return folder


@pytest.mark.parametrize("name", list(BAD_TABLE_INPUT))
def test_bad_table_input_is_one_error_line_and_exit_2(tmp_path, capsys, name):
    tool = _tool()
    folder = _plant(tmp_path, name)
    _assert_refused(*_as_command(tool, [str(folder)], capsys), BAD_TABLE_INPUT[name][2])


def test_a_bad_second_record_leaves_no_half_table(tmp_path, capsys):
    tool = _tool()
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good, bad = _folder(tmp_path / "good", _good_record()), _plant(tmp_path / "bad", "hlo binary")
    _assert_refused(*_as_command(tool, [str(good), str(bad)], capsys), f"{bad}/m.hlo: not UTF-8 text")


@pytest.mark.parametrize("name", ["hlo a directory", "scan missing"])
def test_the_check_catches_the_old_tracebacks(tmp_path, capsys, monkeypatch, name):
    """Planted: the table's old reading (the HLO opened as text unguarded; no check of the fields a row
    reads) gives a traceback (IsADirectoryError, KeyError), and the check above fails on it."""
    tool = _tool()
    monkeypatch.setattr(tool, "hlo_file", lambda folder, record: (folder / record["hlo"],
                                                                   (folder / record["hlo"]).read_text()))
    monkeypatch.setattr(tool, "check_row_fields", lambda where, record: None)
    code, out, err = _as_command(tool, [str(_plant(tmp_path, name))], capsys)
    assert code == 1 and "Traceback" in err
    with pytest.raises(AssertionError):
        _assert_refused(code, out, err, BAD_TABLE_INPUT[name][2])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hlo binary", "hlo truncated", "scan an array", "a gather without operands"])
def test_the_command_itself_prints_one_error_line(tmp_path, name):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, str(ROOT / "tools/aliased_writes.py"), str(_plant(tmp_path, name))],
                         capture_output=True, text=True, timeout=120)
    _assert_refused(res.returncode, res.stdout, res.stderr, BAD_TABLE_INPUT[name][2])
