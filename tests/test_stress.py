"""Stress runner: detection with fault injection, statistics, host syncs, reference, sharding."""

import jax
import numpy as np
import pytest

from harness.programs.tied_embedding import ModelConfig
from harness.stress import report, stats
from harness.stress.runner import (
    RunState,
    StressSpec,
    build_program,
    injected_steps,
    reference_check,
    run_config,
    run_matrix,
)

from .helpers import TINY


def _table(out):
    return report.load_table([out])


def test_injection_detected_exactly_and_ci_contains_rate(tmp_path):
    spec = StressSpec(modes=("full",), remats=(False,), seeds=(1,), steps=400, block=50,
                      inject_nan_rate=0.1, **TINY)
    run_matrix(spec, tmp_path, progress=False)
    t = _table(tmp_path)
    (row,) = t.rows
    assert row.n == 400
    planted = injected_steps(1, 400, 0.1)
    assert row.k == len(planted) > 0
    lo, hi = stats.wilson(row.k, row.n)
    assert lo <= 0.1 <= hi
    # Every detected step is a planted one, found at the update of the tied matrix.
    from harness.stress import store as results
    steps = [s for b in results.read_results(tmp_path / "stress.jsonl").blocks for s in b.steps]
    bad = [s.step for s in steps if not s.finite]
    assert bad == planted.tolist()
    assert {s.first_bad for s in steps if not s.finite} == {"update:['embed']"}
    # A rejected update is not applied: the run stays finite afterwards.
    assert all(s.loss is not None for s in steps)


def test_no_injection_reports_nothing(tmp_path):
    spec = StressSpec(modes=("full", "sparse_only", "dense_only"), remats=(True,), seeds=(1,), steps=30,
                      block=15, **TINY)
    run_matrix(spec, tmp_path, progress=False)
    t = _table(tmp_path)
    assert t.total_nonfinite == 0
    assert [r.n for r in t.rows] == [30, 30, 30]
    text = report.format_table(t)
    assert "full/remat=on/f32" in text and "0/30" in text


def test_flags_stay_on_device_until_block_end(monkeypatch):
    cfg = ModelConfig(mode="full", remat=True, **TINY)
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=20, block=10, **TINY)
    prog = build_program(cfg, spec)
    p, o = prog.init(1)
    calls = []
    real = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda x: calls.append(1) or real(x))
    blocks = list(run_config(prog, 1, spec, RunState(0, p, o)))
    assert [(b.start, b.end) for b in blocks] == [(0, 10), (10, 20)]
    assert len(calls) == 2  # one host sync per block of K steps


def test_reference_flags_wrong_but_finite_update():
    cfg = ModelConfig(mode="full", remat=True, **TINY)
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=1, **TINY)
    prog = build_program(cfg, spec)
    p, o = prog.init(1)
    before = jax.device_get((p, o))
    p2, o2, flags = prog.step(p, o, np.uint32(1), np.int32(0))
    after = jax.device_get(p2)
    good = reference_check(cfg, spec, 1, 0, before[0], before[1], after, prog.names)
    assert good["ok"] and good["worst_ratio"] < 0.5
    # Silent corruption: the tied matrix's update applied twice (finite, wrong).
    bad_after = {**after, "embed": after["embed"] + (after["embed"] - before[0]["embed"])}
    bad = reference_check(cfg, spec, 1, 0, before[0], before[1], bad_after, prog.names)
    assert not bad["ok"] and bad["worst_leaf"] == "['embed']"


def test_reference_run_counts_silent_column(tmp_path):
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=4, reference=True,
                      reference_every=2, **TINY)
    run_matrix(spec, tmp_path, progress=False)
    (row,) = _table(tmp_path).rows
    assert (row.silent, row.referenced) == (0, 2)
    assert "silent (ref)" in report.format_table(_table(tmp_path))


def test_sharded_on_eight_cpu_devices_matches_single_device(tmp_path):
    assert jax.device_count() >= 8, "conftest sets --xla_force_host_platform_device_count=8"
    kw = dict(modes=("full",), remats=(True,), seeds=(1,), steps=3, **TINY)
    sharded = StressSpec(devices=8, **kw)
    prog = build_program(sharded.configs()[0], sharded)
    p, _ = prog.init(1)
    assert len(p["embed"].sharding.device_set) == 8
    assert p["embed"].addressable_shards[0].data.shape == (TINY["vocab"] // 8, TINY["d_model"])
    run_matrix(sharded, tmp_path / "s8", progress=False)
    run_matrix(StressSpec(devices=1, **kw), tmp_path / "s1", progress=False)
    from harness.stress import store as results
    l8 = [s.loss for b in results.read_results(tmp_path / "s8" / "stress.jsonl").blocks for s in b.steps]
    l1 = [s.loss for b in results.read_results(tmp_path / "s1" / "stress.jsonl").blocks for s in b.steps]
    assert len(l8) == 3 and np.allclose(l8, l1, rtol=1e-4)
    assert _table(tmp_path / "s8").total_nonfinite == 0


@pytest.mark.stress
def test_plugin_fixture_passes_clean_run(harness_stress):
    table = harness_stress(modes=("dense_only",), remats=(False,), **TINY)
    assert table.rows[0].n > 0
