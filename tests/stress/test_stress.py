"""Stress runner: detection with fault injection outside the step, protocols, statistics, host
syncs, reference, sharding."""

import json

import jax
import numpy as np
import pytest

from xla_harness.cli import main
from xla_harness.stress.device.inject import injected_steps, step_keys
from xla_harness.stress.device.reference import compare_update, reference_check
from xla_harness.stress.report import stats
from xla_harness.stress.report import summary as report
from xla_harness.stress.results import store as results
from xla_harness.stress.runner import initial_state, prepare, run_config, run_matrix
from xla_harness.stress.spec import StressSpec

from ..helpers import TINY, TINY_ARGS


def _table(out):
    return report.load_table([out])


def _steps(out):
    return [s.to_json() for b in results.read_results(out / "stress.jsonl").blocks for s in b.steps]


@pytest.mark.slow
def test_injection_detected_exactly_and_ci_contains_rate(tmp_path):
    spec = StressSpec(modes=("full",), remats=(False,), seeds=(1,), steps=400, block=50,
                      inject_rate=0.1, **TINY)
    run_matrix(spec, tmp_path)
    t = _table(tmp_path)
    (row,) = t.rows
    assert row.n == 400
    planted = injected_steps(1, 400, 0.1)
    assert row.k == len(planted) == row.injected > 0
    lo, hi = stats.wilson(row.k, row.n)
    assert lo <= 0.1 <= hi
    assert stats.upper_bound(row.k, row.n) >= 0.1
    # Every detected step is a planted one, found in the new value of the tied matrix.
    steps = _steps(tmp_path)
    bad = [s["step"] for s in steps if not s["finite"]]
    assert bad == planted.tolist()
    assert [s["step"] for s in steps if s.get("injected")] == planted.tolist()
    assert {s["first_bad"] for s in steps if not s["finite"]} == {"param:['embed']"}
    # A non-finite step is rolled back: the run stays finite afterwards.
    assert all(s["loss"] is not None for s in steps)


@pytest.mark.slow
def test_no_injection_reports_nothing(tmp_path):
    spec = StressSpec(modes=("full", "sparse_only", "dense_only"), remats=(True,), seeds=(1,), steps=30,
                      block=15, **TINY)
    run_matrix(spec, tmp_path)
    t = _table(tmp_path)
    assert t.total_nonfinite == 0
    assert [r.n for r in t.rows] == [30, 30, 30]
    text = report.format_table(t)
    assert "full/remat=on/f32" in text and "0/30" in text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nan-opt", "inf-opt"])
def test_train_protocol_one_state_fault_is_one_failure(tmp_path, kind):
    """A NaN (or +inf) planted in Adam's second moment is caught in the new optimizer state and
    rolled back with the parameters, so it counts once, not for every later step."""
    seed, rate, steps = 3, 0.08, 40
    planted = injected_steps(seed, steps, rate).tolist()
    assert 1 <= len(planted) <= 6
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(seed,), steps=steps, block=10,
                      inject=kind, inject_rate=rate, **TINY)
    run_matrix(spec, tmp_path)
    got = _steps(tmp_path)
    assert [s["step"] for s in got if not s["finite"]] == planted
    assert all(s["first_bad"].startswith("opt:") and "nu" in s["first_bad"] for s in got if not s["finite"])


@pytest.mark.slow
def test_frozen_protocol_counts_one_fault_as_one_failure(tmp_path):
    seed, rate, steps = 3, 0.08, 40
    planted = injected_steps(seed, steps, rate).tolist()
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(seed,), steps=steps, block=10, protocol="frozen",
                      inject="nan-opt", inject_rate=rate, **TINY)
    run_matrix(spec, tmp_path)
    got = _steps(tmp_path)
    assert [s["step"] for s in got if not s["finite"]] == planted
    # Identical inputs every call: every clean call computes the same loss, bit for bit.
    losses = {s["loss"] for s in got if s["finite"]}
    assert len(losses) == 1
    # The frozen step is jitted without donation (the reporter's protocol).
    blocks = results.read_results(tmp_path / "stress.jsonl").blocks
    assert blocks[0].donate_argnums == () and blocks[0].protocol == "frozen"


@pytest.mark.slow
@pytest.mark.parametrize("commit,per_block", [("step", 1), ("block", 1)])
def test_flags_stay_on_device_until_block_end(monkeypatch, commit, per_block):
    """Per-step commit: the flags of K steps packed in one fetch. Block commit: the K losses and the
    state check's one flag packed in one fetch; nothing per step."""
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=20, block=10, commit=commit, **TINY)
    h = prepare(spec, spec.configs()[0])
    state = initial_state(h, 1)
    calls = []
    real = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda x: calls.append(1) or real(x))
    blocks = list(run_config(h, 1, state))
    assert [(b.start, b.end) for b in blocks] == [(0, 10), (10, 20)]
    assert len(calls) == 2 * per_block


@pytest.mark.slow
def test_reference_flags_wrong_but_finite_update():
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=1, **TINY)
    h = prepare(spec, spec.configs()[0])
    state = initial_state(h, 1)
    batch = h.program.batch(step_keys(1, 0)[0], 0)
    before = jax.device_get((state.params, state.opt_state, batch))
    p2, _, _ = h.step(state.params, state.opt_state, batch)
    after = jax.device_get(p2)
    good = reference_check(h.program, before[0], before[1], before[2], after)
    assert good["ok"] and good["worst_ratio"] < 0.5
    # Silent corruption: one row of the tied matrix's update applied twice (finite, wrong).
    emb = after["embed"].copy()
    emb[5] += emb[5] - before[0]["embed"][5]
    bad = reference_check(h.program, before[0], before[1], before[2], {**after, "embed": emb})
    assert not bad["ok"] and bad["worst_leaf"] == "['embed']" and bad["worst_row"] == 5


@pytest.mark.parametrize("rows,cols", [(100_000, 128), (2_000, 2048)])
def test_per_row_tolerance_stays_sensitive_at_100k_rows(rows, cols):
    """One lost row of a 100k-row matrix: 1/sqrt(100k) of the leaf's norm (the whole-leaf test
    passes it), 100% of its row (the per-row test does not). Rows are judged independently and
    both norms of a row scale with sqrt(cols), so the two shapes together cover 100k x 2048."""
    rng = np.random.default_rng(0)
    before = (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)
    u = (1e-3 * rng.standard_normal((rows, cols)))
    after = (before + u).astype(np.float32)
    clean = compare_update("w", before, after, u, chunk_rows=777)
    assert clean["ratio"] <= 1.0
    lost = after.copy()
    bad = rows - 3
    lost[bad] = before[bad]
    c = compare_update("w", before, lost, u, chunk_rows=777)
    assert (c["leaf_ratio"] < 1.0) == (rows > 10_000)  # the whole-leaf 2-norm misses it in a big matrix
    assert c["row_ratio"] > 1.5 and c["row"] == bad
    doubled = after.copy()
    doubled[3] = (after[3] + u[3]).astype(np.float32)
    d = compare_update("w", before, doubled, u)
    assert d["row"] == 3 and d["ratio"] > 1.5


@pytest.mark.slow
def test_reference_run_counts_silent_column(tmp_path):
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=4, reference=True,
                      reference_every=2, **TINY)
    run_matrix(spec, tmp_path)
    (row,) = _table(tmp_path).rows
    assert (row.silent, row.referenced) == (0, 2)
    assert "silent (ref)" in report.format_table(_table(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lost-row", "doubled-row"])
def test_finite_corruption_is_caught_only_by_reference_from_the_cli(tmp_path, capsys, kind):
    seed, rate, steps = 2, 0.3, 10
    planted = injected_steps(seed, steps, rate).tolist()
    assert planted
    rc = main(["stress", "--out", str(tmp_path), "--modes", "full", "--remat", "on", "--seeds", str(seed),
               "--steps", str(steps), "--inject", kind, "--inject-rate", str(rate), "--reference",
               "--reference-every", "1", "--json", "--quiet", "--fail-on-nonfinite", *TINY_ARGS])
    (row,) = json.loads(capsys.readouterr().out)["configs"]
    assert rc == 0 and row["nonfinite"] == 0  # finite: the finiteness checks see nothing
    assert (row["silent"], row["referenced"], row["injected"]) == (len(planted), steps, len(planted))
    got = _steps(tmp_path)
    assert [s["step"] for s in got if not s["reference"]["ok"]] == planted
    assert all(s["reference"]["worst_leaf"] == "['embed']" for s in got if not s["reference"]["ok"])


@pytest.mark.slow
def test_sharded_on_eight_cpu_devices_matches_single_device(tmp_path):
    assert jax.device_count() >= 8, "conftest sets --xla_force_host_platform_device_count=8"
    kw = dict(modes=("full",), remats=(True,), seeds=(1,), steps=3, **TINY)
    sharded = StressSpec(devices=8, **kw)
    h = prepare(sharded, sharded.configs()[0])
    p = initial_state(h, 1).params
    assert len(p["embed"].sharding.device_set) == 8
    assert p["embed"].addressable_shards[0].data.shape == (TINY["vocab"] // 8, TINY["d_model"])
    run_matrix(sharded, tmp_path / "s8")
    run_matrix(StressSpec(devices=1, **kw), tmp_path / "s1")
    l8 = [s["loss"] for s in _steps(tmp_path / "s8")]
    l1 = [s["loss"] for s in _steps(tmp_path / "s1")]
    assert len(l8) == 3 and np.allclose(l8, l1, rtol=1e-4)
    assert _table(tmp_path / "s8").total_nonfinite == 0
