"""The origin of a where-gradient trap, confirmed by the masking patch: in the patched venv the step is
evaluated again with ``jax_zero_cotangent_masking`` on and comes out finite ("confirmed"); on stock jax
there is no flag to turn on, and nothing is claimed. Run by `make patches-jax-check` in both venvs
(skipped by a plain `pytest`, like test_jax_masking.py)."""

import os
from pathlib import Path

import jax
import pytest

from xla_harness.origin.classify import masking_flag, origin_of
from xla_harness.programs.interface import load_program

VARIANT = os.environ.get("XLA_HARNESS_JAX_VARIANT")
pytestmark = pytest.mark.skipif(VARIANT is None, reason="run by `make patches-jax-check` in both venvs")
PROGRAMS = Path(__file__).resolve().parents[1] / "origin" / "programs"


def _where_trap():
    program = load_program(f"{PROGRAMS / 'whose.py'}:make", kind="where-trap")
    params, opt_state = program.init(jax.random.key(1))
    return program, (params, opt_state), program.batch(jax.random.key(2), 3)


def test_the_masking_flag_is_there_only_in_the_patched_jax():
    assert (masking_flag() is not None) == (VARIANT == "patched")


@pytest.mark.skipif(VARIANT != "patched", reason="patched venv only")
def test_a_where_trap_is_confirmed_by_masking():
    program, state, batch = _where_trap()
    o = origin_of(program.step, state, batch, None, replays=0, masking=masking_flag())
    assert o.cls == "program" and o.evidence["known_class"] == "where-gradient-trap"
    assert o.evidence["masking_rerun"] == "finite" and "confirmed" in o.summary
    assert not jax.config.jax_zero_cotangent_masking  # turned on for the rerun only


@pytest.mark.skipif(VARIANT != "stock", reason="stock venv only")
def test_stock_jax_claims_no_confirmation():
    program, state, batch = _where_trap()
    o = origin_of(program.step, state, batch, None, replays=0, masking=masking_flag())
    assert o.cls == "program" and "masking_rerun" not in o.evidence and "confirmed" not in o.summary
