"""A refused --resume touches nothing: a results file holding a line of another run (another program's
block, an origin of a configuration its header does not run) is refused, naming FILE:LINE, before a
byte is written, though steps are left to run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.stress.runner import run_matrix
from xla_harness.stress.spec import StressSpec

WHOSE = f"{Path(__file__).resolve().parents[1] / 'origin' / 'programs' / 'whose.py'}:make"


def _started(tmp_path: Path) -> tuple[StressSpec, Path, list[str]]:
    spec = StressSpec(program=WHOSE, seeds=(1,), steps=8, block=2)
    run_matrix(spec, tmp_path)
    path = tmp_path / "stress.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n")  # the header and steps 0-3: steps 4-7 left to run
    return spec, path, lines


@pytest.mark.parametrize("plant", ["another program's block", "an origin of another configuration"])
def test_a_resume_into_a_file_with_a_foreign_line_changes_nothing(tmp_path, plant):
    spec, path, lines = _started(tmp_path)
    if plant == "another program's block":
        foreign = {**json.loads(lines[1]), "program": "other.py:make", "label": "other.py:make"}
    else:
        foreign = {"kind": "origin", "label": "other.py:make", "seed": 1, "step": 2, "seconds": 0.1,
                   "time": "2026-12-07T00:00:00Z", "origin": {"class": "input", "summary": "", "where": None,
                                                              "evidence": {}}}
    with open(path, "a") as fh:
        fh.write(json.dumps(foreign) + "\n")
    before = path.read_bytes()
    with pytest.raises(HarnessError, match=r"stress\.jsonl:4: .*other\.py:make.*cannot be continued"):
        run_matrix(spec, tmp_path, resume=True)
    assert path.read_bytes() == before


def test_a_clean_file_resumes(tmp_path):
    spec, path, _ = _started(tmp_path)
    run_matrix(spec, tmp_path, resume=True)
    assert len(path.read_text().splitlines()) == 5  # the header and four blocks of two steps


def test_the_clis_block_limit_is_the_rows_array():
    from xla_harness.names import BLOCK_ROWS
    from xla_harness.stress.device import step_rows
    from xla_harness.stress.loop.blocks import BlockSize

    assert step_rows.ROWS == BLOCK_ROWS == BlockSize.LIMIT


def test_a_resume_under_another_commit_is_said_and_recorded_per_block(tmp_path, capsys):
    spec, path, _ = _started(tmp_path)
    from dataclasses import replace

    from xla_harness.stress.results.store import read_results

    run_matrix(replace(spec, commit="step"), tmp_path, resume=True)
    assert "resumed with --commit step, begun with --commit block" in capsys.readouterr().err
    commits = [b.commit for b in read_results(path).blocks]
    assert commits[:2] == ["block", "block"] and set(commits[2:]) == {"step"}
