"""The report puts every executable the triage drew a verdict from side by side (the compile stage's,
frozen's, train's: fingerprint, instructions, donated arguments, aliased and temp bytes), and says so
when they differ; one executable throughout says that instead."""

from __future__ import annotations

import json
from pathlib import Path

from tests.triage.test_triage_where import _triage_folder
from xla_harness.triage.render import executables, write_report


def _fingerprint(fid: str, instructions: int) -> dict:
    return {"id": fid, "instructions": instructions, "hlo_sha256": fid * 4, "input_output_alias": "",
            "alias_size_in_bytes": 100, "temp_size_in_bytes": 200}


def _set_fingerprint(folder: Path, fp: dict, donate: list[int]) -> None:
    path = folder / "stress.jsonl"
    lines = path.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        block = json.loads(line)
        out.append(json.dumps({**block, "fingerprint": fp, "donate_argnums": donate}))
    path.write_text("\n".join(out) + "\n")


def _folder(tmp_path: Path, frozen_id: str) -> tuple[Path, dict]:
    out = tmp_path / "t"
    state = _triage_folder(out)
    _set_fingerprint(out / "stages/frozen/round-1", _fingerprint(frozen_id, 7514), [])
    for r in ("round-1", "round-2"):
        _set_fingerprint(out / "stages/train" / r, _fingerprint("a" * 16, 7520), [0, 1])
    state["stages"]["compile:host"] = {"ok": False, "error": "not drawn here",
                                       "record": {"fingerprint": {**_fingerprint("a" * 16, 7520),
                                                                  "donate_argnums": [0, 1]}}}
    (out / "triage.json").write_text(json.dumps(state))
    return out, state


def test_frozen_and_train_executables_side_by_side(tmp_path):
    out, state = _folder(tmp_path, "b" * 16)
    rows = executables(state["stages"], out)
    assert rows == [["frozen", "b" * 16, "7514", "()", "100", "200"],
                    ["train", "a" * 16, "7520", "(0, 1)", "100", "200"],
                    ["compile:host", "a" * 16, "7520", "(0, 1)", "100", "200"]]
    write_report(out, state)
    md = (out / "report.md").read_text()
    assert "## Executables" in md and "2 different executables: frozen donates nothing" in md


def test_one_executable_throughout_says_so(tmp_path):
    out, state = _folder(tmp_path, "a" * 16)
    write_report(out, state)
    assert "One executable throughout." in (out / "report.md").read_text()


def test_a_round_without_records_is_left_out(tmp_path):
    out, state = _folder(tmp_path, "b" * 16)
    (out / "stages/frozen/round-1/stress.jsonl").write_text("not json\n")
    assert [r[0] for r in executables(state["stages"], out)] == ["train", "compile:host"]


def test_the_commands_block_opens_with_the_triage_that_made_the_report(tmp_path):
    from xla_harness.cli import build_parser

    out, state = _folder(tmp_path, "a" * 16)
    write_report(out, state)
    md = (out / "report.md").read_text()
    commands = md[md.index("## Commands"):]
    line = next(x for x in commands.splitlines() if x.startswith("xla-harness triage "))
    args = build_parser().parse_args(line.split()[1:])
    assert args.program == state["spec"]["program"] and str(args.out) == str(out)
