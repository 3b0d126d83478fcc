"""The stress CLI end to end: bad input, resume after SIGKILL/SIGTERM, the pytest plugin."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.stress.results import store as results

from ..helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return [sys.executable, "-m", "xla_harness.cli", *args], env


def _steps(out):
    return [(b.label, b.seed, s.step, s.finite, s.loss)
            for b in results.read_results(Path(out) / "stress.jsonl").blocks for s in b.steps]


@pytest.mark.parametrize("args,needle", [
    (["--modes", "full,tied"], "unknown mode 'tied'"),
    (["--dtype", "f16"], "unknown dtype 'f16'"),
    (["--steps", "0"], "--steps: must be a positive integer"),
    (["--steps", "-3"], "--steps: must be a positive integer"),
    (["--seeds", "1,x"], "invalid seed list"),
    (["--remat", "maybe"], "invalid remat list"),
    (["--inject-rate", "2"], "must be in [0, 1]"),
    (["--devices", "3"], "divisible by 3"),
])
def test_bad_input_one_error_line_exit_2(tmp_path, capsys, args, needle):
    rc = main(["stress", "--out", str(tmp_path / "o"), *TINY_ARGS, *args])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err
    assert not (tmp_path / "o" / "stress.jsonl").exists()


def test_usage_error_exits_2(capsys):
    assert main(["stress", "--steps", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_unwritable_out(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rc = main(["stress", "--out", str(blocker / "sub"), "--steps", "1", *TINY_ARGS])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: cannot create output folder")


@pytest.mark.slow
def test_existing_results_are_never_overwritten(tmp_path, capsys):
    out = tmp_path / "o"
    base = ["stress", "--out", str(out), "--modes", "full", "--remat", "off", "--seeds", "1",
            "--steps", "2", "--quiet", *TINY_ARGS]
    assert main(base) == 0
    before = (out / "stress.jsonl").read_bytes()
    capsys.readouterr()
    assert main(base) == 2
    assert "already holds results" in capsys.readouterr().err
    # A different configuration passed to --resume is refused, the file untouched.
    assert main([*base[:-len(TINY_ARGS)], "--resume", "--steps", "5", *TINY_ARGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "steps=2" in err and "different run" in err
    assert (out / "stress.jsonl").read_bytes() == before


def _wait_for_blocks(path, n, proc, limit=240.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count('"kind": "block"') >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()}")
        time.sleep(0.05)  # polling a file, not timing anything
    raise AssertionError("run produced no results in time")


MATRIX = ["--modes", "full,dense_only", "--remat", "on", "--seeds", "1,2", "--steps", "30",
          "--block", "3", "--quiet", *TINY_ARGS]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    argv, env = _cli("stress", "--out", str(out), *MATRIX)
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=600)
    return _steps(out)


@pytest.mark.slow
def test_resume_after_sigkill_has_no_missing_or_duplicate_steps(tmp_path, uninterrupted):
    out = tmp_path / "o"
    argv, env = _cli("stress", "--out", str(out), *MATRIX)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_blocks(out / "stress.jsonl", 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    # As if the kill landed mid-write: a truncated last line.
    with open(out / "stress.jsonl", "a") as fh:
        fh.write('{"kind": "block", "label": "full/remat=on/f32", "seed": 1, "start": 99, "ste')
    done = subprocess.run([*_cli("stress", "--out", str(out), "--resume", *MATRIX)[0]], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "truncated last line" in done.stderr
    got = _steps(out)
    keys = [(lab, seed, step) for lab, seed, step, *_ in got]
    assert len(keys) == len(set(keys)) == 2 * 2 * 30
    assert sorted(got) == sorted(uninterrupted)  # same flags, same losses, bit for bit
    assert "0/30" in done.stdout


@pytest.mark.slow
def test_sigterm_flushes_prints_partial_table_and_resumes(tmp_path, uninterrupted):
    out = tmp_path / "o"
    argv, env = _cli("stress", "--out", str(out), *MATRIX)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_blocks(out / "stress.jsonl", 2, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "full/remat=on/f32" in stdout and "continue with --resume" in stderr
    partial = _steps(out)
    assert 0 < len(partial) < 120
    resumed = subprocess.run(_cli("stress", "--out", str(out), "--resume", *MATRIX)[0], env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(_steps(out)) == sorted(uninterrupted)


@pytest.mark.slow
def test_json_output_and_report_command(tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["stress", "--out", str(out), "--modes", "full", "--remat", "on", "--seeds", "3",
               "--steps", "4", "--inject-rate", "1", "--json", "--quiet", "--fail-on-nonfinite",
               "--plot", str(tmp_path / "p.png"), *TINY_ARGS])
    data = json.loads(capsys.readouterr().out)
    assert rc == 1
    (cfg,) = data["configs"]
    assert (cfg["nonfinite"], cfg["steps"]) == (4, 4) and cfg["ci_high"] == 1.0
    assert data["env"]["backend"] == "cpu" and "XLA_FLAGS" in data["env"]["env"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["report", str(out)]) == 0
    assert "4/4" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nothing")]) == 2


@pytest.mark.slow
def test_every_line_records_environment(tmp_path):
    out = tmp_path / "o"
    assert main(["stress", "--out", str(out), "--modes", "full", "--remat", "off", "--seeds", "1",
                 "--steps", "2", "--quiet", *TINY_ARGS]) == 0
    lines = [json.loads(x) for x in (out / "stress.jsonl").read_text().splitlines()]
    for rec in lines:
        env = rec["env"]
        for key in ("jax", "jaxlib", "plugins", "backend", "device_kind", "device_count", "host",
                    "repo_commit"):
            assert key in env
        assert set(env["env"]) >= {"XLA_FLAGS", "LIBTPU_INIT_ARGS"}


PLUGIN_TEST = """
import pytest
TINY = dict(vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8)

def test_injected(xla_harness_stress):
    xla_harness_stress(modes=("full",), remats=(True,), inject_rate=0.5, **TINY)

def test_clean(xla_harness_stress):
    xla_harness_stress(modes=("full",), remats=(True,), **TINY)

@pytest.mark.xla_harness_gpu
def test_needs_gpu():
    raise AssertionError("must be skipped on a CPU-only machine")
"""


@pytest.mark.slow
def test_pytest_plugin_fails_with_table_and_junit(pytester):
    pytester.makepyfile(test_plugin_inner=PLUGIN_TEST)
    res = pytester.runpytest_inprocess("--xla-harness-stress", "--xla-harness-steps", "6", "--xla-harness-seeds", "1",
                                       "--junitxml", "junit.xml")
    res.assert_outcomes(passed=1, failed=1, skipped=1)
    res.stdout.fnmatch_lines(["*non-finite step(s):*", "*full/remat=on/f32*"])
    junit = (pytester.path / "junit.xml").read_text()
    assert "test_injected" in junit and "non-finite step(s)" in junit and "95% upper" in junit


@pytest.mark.slow
def test_compare_two_runs(tmp_path, capsys):
    common = ["--modes", "full", "--remat", "on", "--seeds", "1", "--steps", "40", "--block", "20",
              "--quiet", *TINY_ARGS]
    assert main(["stress", "--out", str(tmp_path / "a"), "--inject-rate", "0.5", *common]) == 0
    assert main(["stress", "--out", str(tmp_path / "b"), *common]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["comparisons"]
    assert row["significant"] and row["b"]["nonfinite"] == 0 and row["a"]["nonfinite"] > 10
    from xla_harness.stress.report import stats

    needed = row["clean_steps_to_show_fix"]
    assert needed == stats.clean_steps_to_show_fix(row["a"]["nonfinite"], 40) and needed < 40
    assert row["fix"].endswith("B has 40: shown") and f"after {needed} clean steps" in row["fix"]
    assert main(["compare", str(tmp_path / "b"), str(tmp_path / "b")]) == 0
    assert "do not differ significantly" in capsys.readouterr().out
