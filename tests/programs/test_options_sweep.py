"""#34 item 12: make tpu-sweep checks its entries with the programs' option check
(xla_harness/programs/options.py).

It checked entries one at a time as the loop reached them (a compile started before a later bad
entry was refused) and SWEEP='jit=bogus' left an empty folder in results/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..bad_input_cases import SWEEP_ENV, Case, run_process

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- item 12


@pytest.mark.slow
@pytest.mark.parametrize("sweep,cells,says", [
    ("jit=bare jit=bogus", "full:True", "option jit must be one of step, bare, nested, got 'bogus'"),
    ("jit=bogus", "full:True", "option jit must be"),
    ("jit=bare bogus", "full:True", "SWEEP entry 'bogus' is not KEY=VALUE"),
    ("layers=(1.5,2)", "full:True", "option layers must be"),
    ("jit=bare", "full:maybe", "option remat must be True or False, got 'maybe'"),
    ("jit=bare", "full", "SWEEP_CELLS entry 'full' is not MODE:REMAT"),
], ids=["later-bad-value", "bad-value", "later-not-key-value", "bad-layers", "bad-cell", "cell-not-mode-remat"])
def test_the_sweep_checks_every_entry_before_it_starts(sweep, cells, says, tmp_path):
    """Refused at once (no compile started: it would take seconds even at this size), and nothing created
    (jit=bogus left an empty folder in results/)."""
    case = Case("sweep", [], entry="sweep", env={**SWEEP_ENV, "SWEEP": sweep, "SWEEP_CELLS": cells})
    (tmp_path / "case").mkdir()
    code, _, _, err, seconds = run_process(case, tmp_path / "case", ROOT, 600)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err
    assert list((tmp_path / "case").iterdir()) == []
    assert seconds < 15, seconds


def test_the_options_check_the_sweep_runs(capsys):
    from xla_harness.programs.options import main as check

    assert check(["issue-35409", "mode=full", "remat=True", "jit=bare", "layers=(1,2)"]) == 0
    assert check(["issue-35409", "remat=maybe"]) == 2
    assert check(["issue-35409", "jit"]) == 2
    assert check(["tied-embedding"]) == 2  # its options come from the model flags
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: --program issue-35409: option remat must be True or False, got 'maybe'"
    assert err[1] == "error: expected KEY=VALUE, got 'jit'" and err[2].startswith("error: usage:")
