"""Strict results readers: a JSON boolean is not an integer, a block agrees with its header's spec,
and a label no UTF-8 stream can carry (a lone surrogate) still prints."""

from __future__ import annotations

import io
import json
import sys

import pytest

from xla_harness.cli import main
from xla_harness.stress.results import records
from xla_harness.table import format_rows, printable

from ...bad_input_cases import CONFIG, SPEC, block, header, lines


def _write(tmp_path, rows) -> str:
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "stress.jsonl").write_bytes(lines(rows))
    return str(folder)


def _report_fails(tmp_path, capsys, rows, why: str) -> None:
    assert main(["report", _write(tmp_path, rows)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "internal" not in err and why in err, err


def test_the_good_file_reads(tmp_path, capsys):
    assert main(["report", _write(tmp_path, [header(), block(0, 2), block(2, 4)])]) == 0
    assert "full/remat=on/f32" in capsys.readouterr().out


@pytest.mark.parametrize("schema", [True, False, "1", 2])
def test_schema_must_be_the_integer(schema, tmp_path, capsys):
    h = header()
    h["schema"] = schema
    _report_fails(tmp_path, capsys, [h, block(0, 2)], "results schema")


def test_booleans_are_not_integers_in_steps_seeds_and_counts():
    for key in ("start", "seed", "nonfinite"):
        b = block(0, 2)
        b[key] = key != "start"  # start=false, seed=true, nonfinite=true
        with pytest.raises(records.RecordError, match="must be int"):
            records.parse_record(b)
    spec = dict(SPEC, seeds=[True])
    with pytest.raises(records.RecordError, match="must be int"):
        records.parse_spec(spec)
    spec = dict(SPEC, steps=True)
    with pytest.raises(records.RecordError, match="must be int"):
        records.parse_spec(spec)


def _with(**changes):
    b = block(0, 2)
    b.update(changes)
    return b


@pytest.mark.parametrize("blk,why", [
    (_with(label="sparse_only/remat=on/f32", config=dict(CONFIG, mode="sparse_only")), "not a configuration"),
    (_with(label="full/remat=off/f32"), "is not the label of its config"),
    (_with(config=dict(CONFIG, mode="dense_only")), "is not the label of its config"),
    (_with(seed=7), "block seed 7"),
    (_with(program="issue-35409"), "block program 'issue-35409'"),
    (dict(block(4, 6)), "past its header's spec steps (4)"),
])
def test_a_block_that_contradicts_its_header_is_refused(blk, why, tmp_path, capsys):
    _report_fails(tmp_path, capsys, [header(), block(0, 2), blk], why)


def test_check_block_in_spec_accepts_what_the_writer_writes():
    for b in (block(0, 2), block(2, 4)):
        records.check_block_in_spec(records.parse_record(b), SPEC)


def test_printable_escapes_a_lone_surrogate_only():
    assert printable("a\udc80b") == "a\\udc80b"
    assert printable("naïve ✓") == "naïve ✓"
    assert format_rows([["x\udc80"]], header=["h"]) == ["h", "-------", "x\\udc80"]


def test_a_label_with_a_lone_surrogate_prints(tmp_path, capsys, monkeypatch):
    program = "prog\udc80"
    spec = dict(SPEC, program=program, program_options={})
    h = header()
    h["spec"] = spec
    b = block(0, 2)
    b.update(program=program, config={}, label=program)
    folder = tmp_path / "r"
    folder.mkdir()
    # json.dumps writes the surrogate as the escape \udc80, as any JSON writer may
    (folder / "stress.jsonl").write_text(json.dumps(h) + "\n" + json.dumps(b) + "\n")
    strict = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", strict)
    assert main(["report", str(folder)]) == 0
    strict.flush()
    out = strict.buffer.getvalue().decode()
    assert "prog\\udc80" in out
