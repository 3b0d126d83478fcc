"""Nondeterminism localized: a frozen call that differs names the leaves it changed, how many elements
and by how much (ULPs of the leaf's own type); a train step's replay names its loss; the report and
its JSON say so, and results written without the detail are said to lack it."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from xla_harness.stress.device.differences import differences, leaf_difference

PERTURBED = '''
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xla_harness.programs.interface import TrainProgram, step_from_loss


def make(every=3, leaf="b", index=1, size=1e-3):
    opt = optax.sgd(0.1)
    calls = itertools.count()
    base = None

    def noise():  # nonzero on every ``every``'th call of the step, counted on the host
        return np.float32(size if next(calls) % every == every - 1 else 0.0)

    def init(key):
        params = {"w": jax.random.normal(key, (4, 3)), "b": jnp.zeros((3,))}
        return params, opt.init(params)

    def batch(key, step):
        return jax.random.normal(key, (8, 4))

    def loss(params, x):
        return jnp.mean(jnp.tanh(x @ params["w"] + params["b"]) ** 2)

    plain = step_from_loss(loss, opt)

    def step(params, opt_state, x):
        p, o, aux = plain(params, opt_state, x)
        n = jax.experimental.io_callback(noise, jax.ShapeDtypeStruct((), jnp.float32))
        return {**p, leaf: p[leaf].at[index].add(n)}, o, aux

    return TrainProgram(name="perturbed", init=init, batch=batch, step=step)
'''


def test_leaf_difference_counts_elements_gap_and_ulps_per_dtype():
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        a = jnp.asarray([1.0, -2.0, 0.0, 3.0], dtype)
        up = jnp.nextafter(a[1], jnp.asarray(-9, dtype))  # one ULP further from zero, negative side
        b = a.at[1].set(up).at[3].set(jnp.nextafter(jnp.nextafter(a[3], jnp.asarray(9, dtype)),
                                                    jnp.asarray(9, dtype)))
        count, gap, ulp = np.asarray(leaf_difference(a, b))
        assert (count, ulp) == (2, 2), dtype
        assert gap == pytest.approx(float(jnp.abs(b[3].astype(jnp.float32) - a[3].astype(jnp.float32))))
    # a signed zero differs in its bits, by nothing in value
    assert list(np.asarray(leaf_difference(jnp.zeros(2), jnp.zeros(2).at[0].set(-0.0)))) == [1, 0, 0]
    # across zero: the ULPs of both sides add up
    tiny = jnp.asarray([np.float32(1e-45)])
    assert list(np.asarray(leaf_difference(tiny, -tiny))) == [1, pytest.approx(2e-45, abs=1e-45), 2]
    # integers: the difference itself
    assert list(np.asarray(leaf_difference(jnp.arange(4), jnp.arange(4).at[2].set(7)))) == [1, 5, 5]
    assert differences({"a": jnp.ones(2)}, {"a": jnp.ones(2)}).shape == (1, 3)


@pytest.mark.slow
def test_frozen_names_exactly_the_leaf_a_nondeterministic_call_changed(tmp_path, capsys):
    from xla_harness.cli import main

    (tmp_path / "perturbed.py").write_text(PERTURBED)
    args = ["stress", "--program", f"{tmp_path}/perturbed.py:make", "--protocol", "frozen", "--seeds", "1",
            "--steps", "12", "--quiet", "--out", str(tmp_path / "r")]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "perturbed.py:make: 4 nondet step(s): params['b'] in 4 (up to 1 element(s), |diff| <= 0.001" in text
    steps = [s for line in (tmp_path / "r" / "stress.jsonl").read_text().splitlines()[1:]
             for s in json.loads(line)["steps"]]
    nondet = [s for s in steps if s.get("nondet")]
    assert [s["step"] for s in nondet] == [2, 5, 8, 11]  # every 3rd call after the first
    for s in nondet:
        (d,) = s["nondet_detail"]
        assert d["leaf"] == "params['b']" and d["elements"] == 1
        assert d["max_abs"] == pytest.approx(1e-3, rel=1e-3) and d["max_ulp"] > 1000
    assert main(["report", str(tmp_path / "r"), "--json"]) == 0
    (cfg,) = json.loads(capsys.readouterr().out)["configs"]
    assert cfg["nondet"] == 4 and set(cfg["nondet_leaves"]) == {"params['b']"}
    assert cfg["nondet_leaves"]["params['b']"]["steps"] == 4


def test_results_without_the_detail_are_said_to_lack_it(capsys):
    """The first H200 run (frozen, 29 nondet calls) was written before the detail existed."""
    from pathlib import Path

    from xla_harness.cli import main

    folder = Path(__file__).resolve().parents[2] / "results/gpu/h200-2026-11-26/issue-35409-frozen"
    assert main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "issue-35409: 29 nondet step(s)" in text
    assert "29 of them recorded without the leaves that differed" in text
