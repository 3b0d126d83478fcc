"""Each block record holds what the user's program says it was built with (``TrainProgram.options``),
beside what its factory was asked (``config``): a value JSON cannot hold is kept as its text, a
program that says nothing adds nothing, and a file's ``built_with`` of the wrong type is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.stress.results import records
from xla_harness.stress.runner import built_with

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = '''
import jax.numpy as jnp
from xla_harness.programs.interface import TrainProgram

def make(width=3):
    def init(key):
        return {"w": jnp.ones((width,))}, {"m": jnp.zeros((width,))}
    def batch(key, step):
        return jnp.ones((width,))
    def step(p, o, x):
        loss = jnp.sum(p["w"] * x)
        return {"w": p["w"] - 0.1 * x}, {"m": o["m"] + x}, {"loss": loss}
    return TrainProgram(name="tiny", init=init, batch=batch, step=step,
                        options={"width": width, "dtype": jnp.float32, "note": "built here"})
'''


def test_a_value_json_cannot_hold_is_kept_as_text():
    import jax.numpy as jnp

    got = built_with({"width": 3, "dtype": jnp.float32, "sizes": (1, 2)})
    assert got["width"] == 3 and got["sizes"] == [1, 2] and isinstance(got["dtype"], str)
    json.dumps(got)


def test_the_block_record_reads_back_and_a_wrong_type_is_refused():
    line = {"kind": "block", "label": "x", "seed": 1, "start": 0, "end": 1, "nonfinite": 0,
            "steps": [{"step": 0, "finite": True, "first_bad": None, "max_abs_update": 0.1, "loss": 1.0}],
            "config": {}, "built_with": {"width": 3}}
    block = records.parse_record(line)
    assert block.built_with == {"width": 3} and block.to_json()["built_with"] == {"width": 3}
    del line["built_with"]
    assert "built_with" not in records.parse_record(line).to_json()  # older files: nothing said
    line["built_with"] = [3]
    with pytest.raises(records.RecordError, match="built_with"):
        records.parse_record(line)


@pytest.mark.slow
def test_stress_records_what_the_users_program_was_built_with(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "xla_harness.cli", "stress", "--program", f"{tmp_path}/prog.py:make",
                           "--program-option", "width=5", "--steps", "3", "--seeds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    blocks = [json.loads(line) for line in (out / "stress.jsonl").read_text().splitlines()[1:]]
    assert blocks and all(b["built_with"]["width"] == 5 and b["built_with"]["note"] == "built here" for b in blocks)
    assert all(b["config"] == {"width": 5} for b in blocks)


def test_a_user_programs_header_holds_none_of_the_builtin_models_flags():
    from xla_harness.stress.spec import StressSpec

    spec = StressSpec(program="examples/quickstart/my_model.py:make", steps=3).to_dict()
    assert not records.BUILTIN_MODEL_KEYS & set(spec)
    builtin = StressSpec(steps=3).to_dict()  # the built-in model: its flags are its options
    assert set(builtin) >= records.BUILTIN_MODEL_KEYS


def test_a_header_written_with_the_flags_reads_as_one_without_them():
    """Headers written before kept the built-in model's flags for any program (and hashed them): one
    still reads, with the flags dropped and the same fingerprint as a header written now."""
    from xla_harness.stress.spec import StressSpec

    now = StressSpec(program="p.py:make", steps=3).to_dict()
    before = {**now, "dtype": "f32", "vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "seq": 16, "batch": 8,
              "learning_rate": 1e-3}
    old = records.parse_header({"kind": "header", "spec": before, "fingerprint": records.spec_fingerprint(before)})
    new = records.parse_header({"kind": "header", "spec": now, "fingerprint": records.spec_fingerprint(now)})
    assert old.spec == new.spec and old.fingerprint == new.fingerprint
    with pytest.raises(records.RecordError, match="does not match its spec"):
        records.parse_header({"kind": "header", "spec": before, "fingerprint": "0" * 16})
