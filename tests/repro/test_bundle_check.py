"""bundle --check runs only the bundled program, within the bundle's recorded work, reports a lying
expected.json as a difference, never passes with nothing compared, and leaves no temporary folder
or repro child behind (SIGTERM of the check, SIGKILL of its parent)."""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.repro import bundle as bundle_mod
from xla_harness.repro import bundle_check

from ..helpers import FOREIGN_PROGRAM, process_gone

ROOT = Path(__file__).resolve().parents[2]


def _write_bundle(path: Path, files: dict[str, bytes]) -> Path:
    """A bundle holding exactly ``files`` (plus a manifest of them)."""
    files = dict(files)
    import hashlib

    files["manifest.json"] = json.dumps({"sha256": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
                                         }).encode()
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"bundle/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _program_bundle(path: Path, program: str, steps: int = 1, seeds=(1,), extra=None) -> Path:
    config = {"program": program, "options": {"command": "touch X"}, "seeds": list(seeds), "steps": steps}
    files = {"repro.py": bundle_mod.STANDALONE_PROGRAM.read_bytes(), "config.json": json.dumps(config).encode(),
             "expected.json": b'{"seeds": {}}', "findings.json": b'{"modules": []}',
             "program/my_model.py": b"raise SystemExit('must not run')\n"}
    files.update(extra or {})
    return _write_bundle(path, files)


@pytest.mark.parametrize("program", ["os:system", "builtins:exec", "../x.py:make", "/tmp/x.py:make",
                                     "sub/my_model.py:make", "my_model.py:os.system", "my_model.py",
                                     "other.py:make"])
def test_check_runs_only_the_bundled_program(tmp_path, capsys, monkeypatch, program):
    monkeypatch.chdir(tmp_path)
    b = _program_bundle(tmp_path / "b.tar.gz", program)
    assert main(["bundle", "--check", str(b), "--run-program"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "internal" not in err and "config.json program" in err
    assert not (tmp_path / "X").exists()


def test_standalone_program_refuses_a_module_of_the_machine(tmp_path):
    from xla_harness.repro import standalone_program

    source = tmp_path / "program"
    source.mkdir()
    (source / "my_model.py").write_text("")
    builtins = {"issue-35409": "xla_harness.programs.issue_35409:make", "evil": "os:system"}
    for spec in ("os:system", "evil", "issue-35409", "../my_model.py:make", "my_model.py:a.b"):
        with pytest.raises(SystemExit, match="not a program bundled in"):
            standalone_program.bundled_spec(spec, source, builtins)
    assert standalone_program.bundled_spec("my_model.py:make", source, builtins) == f"{source}/my_model.py:make"


def test_check_bounds_the_recorded_work(tmp_path):
    cfg = {"steps": 1_000_000, "seeds": [1, 2]}
    with pytest.raises(HarnessError, match=r"takes 2000000 steps \(1000000 steps x 2 seeds x 1 config\), "
                                           r"more than --max-steps 10000"):
        bundle_check.check_work(cfg, tmp_path / "b.tar.gz", bundle_check.MAX_CHECK_STEPS)
    bundle_check.check_work(cfg, tmp_path / "b.tar.gz", 2_000_000)  # raised by the flag


def test_max_steps_must_be_positive(tmp_path, capsys):
    b = _program_bundle(tmp_path / "b.tar.gz", "my_model.py:make")
    assert main(["bundle", "--check", str(b), "--max-steps", "0"]) == 2
    assert "--max-steps: must be a positive integer" in capsys.readouterr().err


def _run(nonfinite=0, losses=(1.0, 2.0)):
    return {"nonfinite": nonfinite, "losses": list(losses)}


ONE = {"1": _run()}


@pytest.mark.parametrize("expected,got,why", [
    ({}, ONE, "expected.json: no seeds to compare"),
    ({"1": _run(losses=(1.0,))}, ONE, "seed 1: 2 losses in the re-run, 1 in the bundle"),  # zip() of unequal lengths
    ({"1": _run(losses=())}, ONE, "seed 1: 2 losses in the re-run, 0 in the bundle"),
    ({"1": {"nonfinite": True, "losses": [1.0, 2.0]}}, ONE, "no non-finite count and losses"),
    ({"1": {"nonfinite": 0, "losses": ["x", 2.0]}}, ONE, "no non-finite count and losses"),
    ({"1": "x"}, ONE, "no non-finite count and losses"),
    ({"9": _run()}, {}, "seed 9: missing from the re-run"),
])
def test_a_lying_expected_json_is_different_not_internal(expected, got, why):
    report = bundle_check.CheckReport()
    bundle_check.compare_runs({"seeds": expected}, {"jax": "x", "backend": "cpu", "seeds": got}, report)
    assert not report.same and any(why in line for line in report.lines), report.lines


def test_a_seed_only_in_the_re_run_is_different():
    report = bundle_check.CheckReport()
    bundle_check.compare_runs({"seeds": {"1": _run()}}, {"jax": "x", "backend": "cpu",
                                                      "seeds": {"1": _run(), "2": _run()}}, report)
    assert not report.same and "seed 2: in the re-run but missing from expected.json" in report.lines[0]


def test_matching_records_are_same():
    report = bundle_check.CheckReport()
    bundle_check.compare_runs({"seeds": {"1": _run()}}, {"jax": "x", "backend": "cpu", "seeds": {"1": _run()}},
                            report)
    assert report.same


@pytest.fixture(scope="module")
def foreign_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fb")
    (folder / "my_model.py").write_text(FOREIGN_PROGRAM)
    out = folder / "b.tar.gz"
    assert main(["bundle", "--program", f"{folder / 'my_model.py'}:make", "--out", str(out),
                 "--steps", "3", "--seeds", "1,2"]) == 0
    return out


def _edit(bundle, dst, name, edit):
    with tarfile.open(bundle) as src, tarfile.open(dst, "w:gz") as out:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name == f"bundle/{name}":
                data = edit(data)
                m.size = len(data)
            out.addfile(m, io.BytesIO(data) if data is not None else None)
    return dst


def _json_edit(change):
    def edit(data):
        obj = json.loads(data)
        change(obj)
        return json.dumps(obj).encode()
    return edit


@pytest.mark.slow
def test_work_past_the_limit_is_refused_before_running(foreign_bundle, tmp_path, capsys):
    big = _edit(foreign_bundle, tmp_path / "big.tar.gz", "config.json",
                _json_edit(lambda c: c.update(steps=1_000_000)))
    t0 = time.monotonic()
    assert main(["bundle", "--check", str(big), "--run-program"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "more than --max-steps 10000" in err and "internal" not in err
    assert time.monotonic() - t0 < 60
    assert main(["bundle", "--check", str(foreign_bundle), "--run-program", "--max-steps", "5"]) == 2
    assert "takes 6 steps" in capsys.readouterr().err


@pytest.mark.slow
def test_a_lying_expected_json_exits_1(foreign_bundle, tmp_path, capsys):
    short = _edit(foreign_bundle, tmp_path / "short.tar.gz", "expected.json",
                  _json_edit(lambda e: e["seeds"]["1"]["losses"].pop()))
    assert main(["bundle", "--check", str(short), "--run-program"]) == 1
    out = capsys.readouterr().out
    assert "seed 1: 3 losses in the re-run, 2 in the bundle -> DIFFERENT" in out
    empty = _edit(foreign_bundle, tmp_path / "empty.tar.gz", "expected.json",
                  _json_edit(lambda e: e.update(seeds={})))
    assert main(["bundle", "--check", str(empty), "--run-program"]) == 1
    assert "expected.json: no seeds to compare" in capsys.readouterr().out


def _temp_folders():
    import tempfile

    return set(Path(tempfile.gettempdir()).glob("xla-harness-check-*"))


SLOW_REPRO = """
import os, sys, time
open(os.environ["REPRO_PIDFILE"], "w").write(str(os.getpid()))
time.sleep(120)
"""


def _wait_file(path: Path, seconds: float = 30.0) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.is_file() and path.read_text():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


# A check whose re-run hangs: run in its own interpreter so that it can be sent SIGTERM or killed.
CHECKER = """
import sys
from pathlib import Path
from xla_harness.cli import main
from xla_harness.repro import bundle_check
bundle_check.STANDALONE_PROGRAM = Path(sys.argv[2])
bundle_check.check_derived = lambda root, path, report: None
raise SystemExit(main(["bundle", "--check", sys.argv[1], "--run-program"]))
"""


def _hanging_check(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "slow_repro.py"
    script.write_text(SLOW_REPRO)
    b = _program_bundle(tmp_path / "b.tar.gz", "my_model.py:make", extra={"repro.py": script.read_bytes()})
    pidfile = tmp_path / "repro.pid"
    env = {**os.environ, "REPRO_PIDFILE": str(pidfile), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", CHECKER, str(b), str(script)], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
    return proc, int(_wait_file(pidfile))


@pytest.mark.slow
def test_sigterm_during_check_removes_the_temp_folder_and_the_repro(tmp_path):
    proc, child = _hanging_check(tmp_path)
    assert list(tmp_path.glob("xla-harness-check-*"))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("xla-harness-check-*"))
    assert process_gone(child)


@pytest.mark.slow
def test_a_killed_check_leaves_no_repro_running(tmp_path):
    proc, child = _hanging_check(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    assert process_gone(child), "the repro outlived its killed parent"
