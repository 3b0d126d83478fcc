"""The mutation test: on every committed dump that carries XLA's live range, values moved onto other
values' bytes with a fixed seed; XLA's live range (never memcheck) says which moves are races. Every
race must be caught and every harmless move left clean (tools/memcheck_mutants.py prints the same)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import memcheck_mutants  # noqa: E402

DUMPS = memcheck_mutants.committed()


def test_the_committed_dumps_with_a_live_range():
    assert len(DUMPS) >= 7 and any("tpu-aot" in str(p) for p in DUMPS) and any("cuda-aot" in str(p) for p in DUMPS)


@pytest.mark.slow
@pytest.mark.parametrize("module", DUMPS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_every_planted_race_is_caught_and_every_harmless_move_is_clean(module):
    caught, planted, clean, moved, misses = memcheck_mutants.run(module, seed=0, races=20, harmless=20)
    assert misses == []
    assert caught == planted >= 1 and clean == moved
    if "memory-plan/dump" not in str(module):  # the 2-value module has one move, a race
        assert planted == 20 and moved == 20
