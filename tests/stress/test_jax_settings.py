"""The jax settings that change the lowered or compiled program: recorded with every stress and
compile record, part of the stress spec's fingerprint, and never pooled when they differ."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.stress.compile_only import records as compile_records
from xla_harness.stress.compile_only import resume as compile_resume
from xla_harness.stress.compile_only import run as compile_only
from xla_harness.stress.compile_only import table as compile_table
from xla_harness.stress.report import summary as report
from xla_harness.stress.results import provenance, records
from xla_harness.stress.results import store as results
from xla_harness.stress.runner import run_matrix
from xla_harness.stress.spec import StressSpec
from xla_harness.targets import parse_target

from ..bad_input_cases import SPEC, block, header, lines
from ..helpers import TINY

ROOT = Path(__file__).resolve().parents[2]
ONE_STEP = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=1, **TINY)


def test_the_settings_are_read_however_they_are_set():
    base = provenance.jax_settings()
    for name in ("jax_default_matmul_precision", "jax_enable_x64", "jax_default_prng_impl",
                 "jax_threefry_partitionable"):
        assert name in base, name
    with jax.default_matmul_precision("highest"):  # a context manager around the run
        assert provenance.jax_settings()["jax_default_matmul_precision"] == "highest"
    old = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", not old)  # jax.config.update
    try:
        assert provenance.jax_settings()["jax_threefry_partitionable"] is (not old)
    finally:
        jax.config.update("jax_threefry_partitionable", old)
    assert provenance.jax_settings() == base
    json.dumps(base)  # every value is JSON


@pytest.mark.slow
def test_an_environment_variable_is_read():
    code = ("import json; from xla_harness.stress.results.provenance import jax_settings; "
            "print(json.dumps(jax_settings()))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "JAX_DEFAULT_MATMUL_PRECISION": "highest",
           "JAX_ENABLE_X64": "1", "JAX_DEFAULT_PRNG_IMPL": "rbg"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    settings = json.loads(out.stdout)
    assert (settings["jax_default_matmul_precision"], settings["jax_enable_x64"], settings["jax_default_prng_impl"]) \
        == ("highest", True, "rbg")


def test_a_differing_setting_changes_the_fingerprint():
    spec = ONE_STEP.to_dict()
    plain = provenance.with_jax_settings(spec)
    with jax.default_matmul_precision("highest"):
        highest = provenance.with_jax_settings(spec)
    assert records.spec_fingerprint(plain) != records.spec_fingerprint(highest)
    assert records.spec_fingerprint(plain) == records.spec_fingerprint(provenance.with_jax_settings(spec))
    assert results.spec_difference(plain, highest) == \
        "jax setting jax_default_matmul_precision=None, now 'highest'"
    # A spec written before the settings were recorded keeps the fingerprint it always had.
    core = {k: v for k, v in SPEC.items() if k not in records.RUN_SHAPE_KEYS}
    assert records.spec_fingerprint(SPEC) == hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """One-step runs of the built-in: one as jax reads by default, one under a matmul precision
    set around it (what JAX_DEFAULT_MATMUL_PRECISION or jax.config.update would set)."""
    root = tmp_path_factory.mktemp("runs")
    run_matrix(ONE_STEP, root / "plain")
    with jax.default_matmul_precision("highest"):
        run_matrix(ONE_STEP, root / "highest")
    return root


def test_runs_record_their_settings_in_header_and_blocks(two_runs):
    for name, expected in (("plain", None), ("highest", "highest")):
        res = results.read_results(two_runs / name / "stress.jsonl")
        assert res.header.spec["jax_config"]["jax_default_matmul_precision"] == expected
        assert all(b.env["jax_config"]["jax_default_matmul_precision"] == expected for b in res.blocks)
        assert res.blocks[0].label == "full/remat=on/f32"  # the same row name: only the settings differ


def test_report_and_merge_refuse_runs_under_other_settings(two_runs, capsys):
    folders = [str(two_runs / "plain"), str(two_runs / "highest")]
    with pytest.raises(HarnessError, match=r"different runs \(jax setting jax_default_matmul_precision=None, "
                                           r"now 'highest'\); report them apart"):
        report.load_table([Path(f) for f in folders])
    for command in ("report", "merge"):
        assert main([command, *folders]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("error:") and "jax_default_matmul_precision" in err[0], err
    assert main(["merge", "--allow-mixed-specs", *folders]) == 0
    # One run's folder alone, or twice, is one set of settings.
    assert main(["merge", folders[1], folders[1]]) == 0
    capsys.readouterr()


def test_resume_under_other_settings_is_refused(two_runs):
    path = two_runs / "plain" / "stress.jsonl"
    before = path.read_bytes()
    with jax.default_matmul_precision("high"), \
            pytest.raises(HarnessError, match=r"different run \(jax setting jax_default_matmul_precision=None, "
                                              r"now 'high'\)"):
        results.open_run(path, ONE_STEP.to_dict(), resume=True)
    with results.open_run(path, ONE_STEP.to_dict(), resume=True) as w:  # the same settings continue it
        assert len(w.blocks) == 1
    assert path.read_bytes() == before


def test_old_files_without_settings_still_read_and_pool_only_with_their_like(tmp_path, two_runs, capsys):
    """A file written before the settings were recorded: read as before (its fingerprint unchanged),
    pooled with another such file, refused beside one that records them (its settings are unknown)."""
    old = lines([header(), block(0, 2), block(2, 4)])
    for name in ("old1", "old2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "stress.jsonl").write_bytes(old)
    res = results.read_results(tmp_path / "old1" / "stress.jsonl")
    assert "jax_config" not in res.header.spec and res.header.fingerprint == records.spec_fingerprint(SPEC)
    assert main(["merge", str(tmp_path / "old1"), str(tmp_path / "old2")]) == 0
    capsys.readouterr()
    # The old file's spec is SPEC; a run of SPEC now records its settings.
    (tmp_path / "new").mkdir()
    with results.open_run(tmp_path / "new" / "stress.jsonl", dict(SPEC), resume=False) as w:
        w.write_header(dict(SPEC), {})
        w.append(records.parse_record(block(0, 4)))
    assert main(["merge", str(tmp_path / "old1"), str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert "jax settings not recorded (a record written before the harness recorded them), now recorded" in err
    with pytest.raises(HarnessError, match="jax settings not recorded"):
        results.open_run(tmp_path / "old1" / "stress.jsonl", dict(SPEC), resume=True)


# ----------------------------------------------------------------------------- compile records


def _compile_record(label: str, settings: dict | None, target: str = "tpu:v6e:2x4") -> dict:
    rec = {"kind": "compile", "label": label, "target": target, "versions": {"jax": "0.12.0.1", "libtpu": "0.0.50.1"},
           "scan": {"hazard": 0, "decisions": 0}, "fingerprint": {"id": "f", "instructions": 1},
           "compile_cpu_s": 1.0}
    if settings is not None:
        rec["jax_config"] = settings
    return rec


def test_one_configuration_under_two_settings_is_refused_in_the_compile_table():
    plain = provenance.jax_settings()
    highest = {**plain, "jax_default_matmul_precision": "highest"}
    compile_table.check_compile_settings([_compile_record("a", plain), _compile_record("b", highest)])
    compile_table.check_compile_settings([_compile_record("a", plain), _compile_record("a", plain)])
    compile_table.check_compile_settings([_compile_record("a", None), _compile_record("a", None)])
    with pytest.raises(HarnessError, match=r"^a on tpu:v6e:2x4 was compiled under two sets of jax settings "
                                           r"\(jax setting jax_default_matmul_precision=None, now 'highest'\)"):
        compile_table.check_compile_settings([_compile_record("a", plain), _compile_record("a", highest)])
    with pytest.raises(HarnessError, match="jax settings not recorded"):
        compile_table.check_compile_settings([_compile_record("a", None), _compile_record("a", plain)])
    # Other versions or another target: another configuration.
    other = {**_compile_record("a", highest), "versions": {"jax": "0.9.0.1", "libtpu": "0.0.34"}}
    compile_table.check_compile_settings([_compile_record("a", plain), other])
    # Where records of one version differ, the table names the setting.
    rows = compile_table.compile_table_rows([_compile_record("a", plain), _compile_record("b", highest)])
    assert [r[3] for r in rows] == ["a {jax_default_matmul_precision=None}", "b {jax_default_matmul_precision=highest}"]
    assert [r[3] for r in compile_table.compile_table_rows([_compile_record("a", plain)])] == ["a"]


def test_report_refuses_a_compile_folder_with_one_label_under_two_settings(tmp_path, capsys):
    plain = provenance.jax_settings()
    highest = {**plain, "jax_default_matmul_precision": "highest"}
    for name, settings in (("a", plain), ("b", highest)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "compile.jsonl").write_text(json.dumps(_compile_record("x", settings)) + "\n")
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error:") and "two sets of jax settings" in err[0], err
    assert main(["report", "--allow-mixed-specs", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "x {jax_default_matmul_precision=highest}" in capsys.readouterr().out


def test_compile_resume_refuses_a_label_compiled_under_other_settings(tmp_path, capsys):
    target = parse_target("tpu:v6e:2x4")
    plain = provenance.jax_settings()
    highest = {**plain, "jax_default_matmul_precision": "highest"}
    path = tmp_path / "compile.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        _compile_record("a", plain), _compile_record("b", None), _compile_record("c", highest))))
    run = {"program": None, "versions": {"jax": "0.12.0.1", "libtpu": "0.0.50.1"}, "env": {}, "protocol": "train",
           "autotune_sha256": None, "jax_config": plain}
    done, _, _ = compile_resume._read_done(path, True, target, run, {"a": {}, "b": {}})
    assert set(done) == {"a", "b", "c"}  # c is not asked for: its settings are its own
    assert "b was recorded without its jax settings" in capsys.readouterr().err
    with pytest.raises(HarnessError, match=r"compile.jsonl:3: c was compiled under other jax settings \(jax setting "
                                           r"jax_default_matmul_precision='highest', now None\)"):
        compile_resume._read_done(path, True, target, run, {"a": {}, "c": {}})


def test_a_compile_record_holds_the_settings_it_was_compiled_under(tmp_path):
    spec = StressSpec(program="issue-35409", program_options=(("layers", (1, 2)), ("scale", 1 / 64),
                                                              ("seq_scale", 1 / 8)))
    target = parse_target("host")
    with jax.default_matmul_precision("highest"):
        (rec,) = compile_only.compile_matrix(spec, target, tmp_path / "out")
    assert rec.record["jax_config"]["jax_default_matmul_precision"] == "highest"
    (line,) = compile_records.read_compile_records(tmp_path / "out" / "compile.jsonl")
    assert line["jax_config"] == rec.record["jax_config"]
    with pytest.raises(HarnessError, match="compiled under other jax settings"):
        list(compile_only.compile_matrix(spec, target, tmp_path / "out", resume=True))
    with jax.default_matmul_precision("highest"):
        assert list(compile_only.compile_matrix(spec, target, tmp_path / "out", resume=True)) == []
