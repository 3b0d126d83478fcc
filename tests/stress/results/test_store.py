"""The results store: schema validation, the writer's lock, tail repair, and how report/merge
pool steps. Concurrency is tested with real locks: in-process for a writer caught mid-line,
and with two real `stress` processes (slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.stress.report import summary as report
from xla_harness.stress.results import provenance, record_text, records
from xla_harness.stress.results import store as results

from ...bad_input_cases import GOOD, RUN_ARGS, SPEC, block, header, lines
from ...helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[3]


def _current_header() -> dict:
    """The header a run of SPEC writes now: its spec with this process's jax settings."""
    h = header()
    h["spec"] = provenance.with_jax_settings(h["spec"])
    return h


# GOOD as this harness writes it (GOOD itself is a file written before the jax settings were recorded).
CURRENT = lines([_current_header(), block(0, 2), block(2, 4)])


def _write(folder: Path, data: bytes, name: str = "stress.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


# ----------------------------------------------------------------------------- records


def test_fingerprint_ignores_which_trials_and_tracks_what_a_step_computes():
    fp = records.spec_fingerprint(SPEC)
    assert records.spec_fingerprint({**SPEC, "seeds": [7, 8], "steps": 99, "modes": ["full", "dense_only"]}) == fp
    assert records.spec_fingerprint({**SPEC, "learning_rate": 0.01}) != fp
    assert records.spec_fingerprint({**SPEC, "inject_rate": 0.5}) != fp


def test_records_round_trip_and_one_label_function():
    from xla_harness.programs.tied_embedding import ModelConfig

    for raw in GOOD.splitlines():
        rec = records.parse_line(raw)
        assert records.parse_line(record_text.dumps(rec).encode()) == rec
    cfg = ModelConfig(mode="dense_only", remat=False, dtype="bf16")
    assert cfg.label() == records.label(cfg.to_dict()) == "dense_only/remat=off/bf16"


@pytest.mark.parametrize("mutate,needle", [
    (lambda b: b.pop("label"), "stress.jsonl:2: block lacks the key 'label'"),
    (lambda b: b.update(seed="1"), "stress.jsonl:2: block 'seed' must be int"),
    (lambda b: b["steps"][1].update(step=9), "stress.jsonl:2: block steps are not exactly steps 0..1"),
    (lambda b: b.update(nonfinite=1), "stress.jsonl:2: block nonfinite 1 does not match its steps"),
])
def test_reader_names_file_line_and_what_is_wrong(tmp_path, mutate, needle):
    b = block(0, 2)
    mutate(b)
    _write(tmp_path, lines([header(), b, block(2, 4)]))
    with pytest.raises(HarnessError) as exc:
        results.read_results(tmp_path / "stress.jsonl")
    assert needle in str(exc.value)


def test_reader_skips_a_line_being_written_and_keeps_a_complete_one(tmp_path):
    p = _write(tmp_path, GOOD + b'{"kind": "block", "lab')
    assert [b.start for b in results.read_results(p).blocks] == [0, 2]
    p.write_bytes(GOOD + json.dumps(block(4, 6)).encode())  # valid, newline not yet written
    assert [b.start for b in results.read_results(p).blocks] == [0, 2, 4]


# ----------------------------------------------------------------------------- open_run


def test_resume_completes_a_valid_last_line_instead_of_cutting_it(tmp_path):
    p = _write(tmp_path, CURRENT.rstrip(b"\n"))
    with results.open_run(p, dict(SPEC), resume=True) as w:
        assert [b.start for b in w.blocks] == [0, 2]
    assert p.read_bytes() == CURRENT


def test_resume_cuts_only_a_tail_that_does_not_parse(tmp_path, capsys):
    p = _write(tmp_path, CURRENT + b'{"kind": "block", "sta')
    with results.open_run(p, dict(SPEC), resume=True) as w:
        assert len(w.blocks) == 2
    assert p.read_bytes() == CURRENT
    assert "removed a truncated last line" in capsys.readouterr().err


def test_a_record_after_close_is_refused_and_the_file_left_alone(tmp_path):
    p = _write(tmp_path, CURRENT)
    with results.open_run(p, dict(SPEC), resume=True) as w:
        pass
    with pytest.raises(HarnessError, match="after its writer was closed"):
        w.append(w.blocks[-1])  # a valid record: only the closed file refuses it
    assert p.read_bytes() == CURRENT


@pytest.mark.parametrize("content", [b'{"user": 1}\n{"user": 2', b"notes\nmore notes", b"\n\n"])
def test_a_file_that_is_not_ours_is_never_touched(tmp_path, content):
    p = _write(tmp_path, content)
    with pytest.raises(HarnessError, match="not a stress results header|is empty"):
        results.open_run(p, dict(SPEC), resume=True)
    assert p.read_bytes() == content


def test_options_are_compared_before_any_repair(tmp_path):
    data = CURRENT + b'{"kind": "block", "sta'
    p = _write(tmp_path, data)
    with pytest.raises(HarnessError, match=r"different run \(learning_rate=0.001, now 0.01\)"):
        results.open_run(p, {**SPEC, "learning_rate": 0.01}, resume=True)
    assert p.read_bytes() == data


def test_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    p = tmp_path / "stress.jsonl"
    with results.open_run(p, dict(SPEC), resume=False) as first:
        first.write_header(dict(SPEC), {})
        for resume in (False, True):
            with pytest.raises(HarnessError, match="another stress run is writing"):
                results.open_run(p, dict(SPEC), resume=resume)
        first.append(block(0, 2))
    with results.open_run(p, dict(SPEC), resume=True) as again:  # released on close
        assert [b.start for b in again.blocks] == [0]


def test_rejected_resume_during_a_live_write_loses_nothing(tmp_path, capsys):
    """A live writer is mid-line when `stress --resume` (same or other options) arrives: the
    resume is refused with exit 2 before it reads the file, and the writer's line completes."""
    out = tmp_path / "o"
    p = out / "stress.jsonl"
    with results.open_run(p, dict(SPEC), resume=False) as live:
        live.write_header(dict(SPEC), {})
        live.append(block(0, 2))
        half = json.dumps(block(2, 4)).encode()
        with open(p, "ab") as fh:  # the live writer's next line, half written
            fh.write(half[:40])
        snapshot = p.read_bytes()
        for extra in ([], ["--lr", "0.01"], ["--steps", "8"]):
            assert main(["stress", "--resume", "--quiet", "--out", str(out), *RUN_ARGS, *extra]) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: another stress run is writing") and err.count("\n") == 1
            assert p.read_bytes() == snapshot
        with open(p, "ab") as fh:
            fh.write(half[40:] + b"\n")
    assert results.read_results(p).blocks == [records.parse_block(block(0, 2)), records.parse_block(block(2, 4))]


def _steps_of(path: Path) -> list[tuple[str, int, int]]:
    return [(b.label, b.seed, s.step) for b in results.read_results(path).blocks for s in b.steps]


@pytest.mark.slow
def test_two_real_writers_on_one_out(tmp_path):
    """Two `stress` processes on one --out: every later one (plain, --resume with the same or
    other options) is refused with exit 2 while the first runs; the first's file ends with
    every step exactly once and every line valid."""
    out = tmp_path / "o"
    # Far more steps than the test waits for: the first writer is stopped by SIGINT once the others ran.
    matrix = ["--modes", "full", "--remat", "on", "--seeds", "1", "--steps", "1000000", "--block", "1", "--quiet",
              *TINY_ARGS]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "xla_harness.cli", "stress", "--out", str(out)]
    first = subprocess.Popen([*cmd, *matrix], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p = out / "stress.jsonl"
    deadline = time.monotonic() + 300
    while not (p.exists() and p.read_bytes().count(b'"kind": "block"') >= 2):
        assert first.poll() is None, first.stderr.read()
        assert time.monotonic() < deadline, "first writer produced no blocks"
        time.sleep(0.05)  # polling a file, not timing anything
    refused = []
    for extra in ([], ["--resume"], ["--resume", "--lr", "0.01"]):
        second = subprocess.run([*cmd, *matrix, *extra], env=env, capture_output=True, text=True, timeout=300)
        refused.append((second.returncode, second.stderr.count("error:"), "Traceback" in second.stderr))
    if first.poll() is not None:
        pytest.fail("the first writer ended before the second ones ran: not a concurrent test")
    first.send_signal(signal.SIGINT)  # finishes its step, writes it, exits 130
    assert first.wait(timeout=600) == 130, first.stderr.read()
    assert refused == [(2, 1, False)] * 3
    steps = _steps_of(p)
    assert len(steps) >= 2 and sorted(steps) == [("full/remat=on/f32", 1, i) for i in range(len(steps))]  # once each


# ----------------------------------------------------------------------------- report / merge


def test_mixed_specs_under_one_label_are_refused_unless_asked(tmp_path, capsys):
    _write(tmp_path / "a", GOOD)
    _write(tmp_path / "b", GOOD.replace(b'"learning_rate": 0.001', b'"learning_rate": 0.01'))
    with pytest.raises(HarnessError, match="learning_rate=0.001, now 0.01"):
        report.load_table([tmp_path / "a", tmp_path / "b"])
    table = report.load_table([tmp_path / "a", tmp_path / "b"], allow_mixed_specs=True)
    assert table.rows[0].n == 8  # different specs: different trials, all counted
    assert main(["merge", "--allow-mixed-specs", str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_conflicting_duplicates_warn_and_order_does_not_change_counts(tmp_path, capsys):
    bad = block(0, 2)
    bad["steps"][0].update(finite=False, first_bad="loss")
    bad["nonfinite"] = 1
    _write(tmp_path / "a", GOOD)
    _write(tmp_path / "b", lines([header(), bad]))
    ab = report.load_table([tmp_path / "a", tmp_path / "b"])
    ba = report.load_table([tmp_path / "b", tmp_path / "a"])
    assert ab.rows[0].n == ba.rows[0].n == 4
    assert ab.warnings and "1 step(s) recorded twice with different outcomes" in ab.warnings[0]
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "warning: 1 step(s) recorded twice" in capsys.readouterr().err


def test_gaps_of_a_huge_spec_come_from_intervals(tmp_path):
    h = header()
    h["spec"] = {**SPEC, "steps": 10**12}
    _write(tmp_path, lines([h, block(0, 2), block(3, 5)]))
    res = results.read_results(tmp_path / "stress.jsonl")
    assert report.find_gaps(res) == [
        f"stress.jsonl: full/remat=on/f32 seed 1: 4/{10**12} steps (missing from step 2)"]


@pytest.mark.parametrize("errno_,text", [(28, "No space left on device"), (30, "Read-only file system")])
def test_a_failing_write_is_one_clear_error(tmp_path, monkeypatch, errno_, text):
    p = tmp_path / "stress.jsonl"
    with results.open_run(p, dict(SPEC), resume=False) as w:
        def fail(fd):
            raise OSError(errno_, text)

        monkeypatch.setattr(results.os, "fsync", fail)
        with pytest.raises(HarnessError, match=f"cannot write results to .*stress.jsonl: {text}"):
            w.write_header(dict(SPEC), {})


# ----------------------------------------------------------------------------- what a record says made it


@pytest.fixture
def fresh_commit(monkeypatch):
    """repo_commit asked afresh (it is asked once per process), the cached one back afterwards."""
    monkeypatch.setattr(provenance, "repo_commit", provenance.repo_commit.__wrapped__)


def test_no_commit_is_recorded_outside_this_projects_clone(fresh_commit, monkeypatch, tmp_path):
    """Installed from a wheel (no checkout), or from a checkout that is no clone (an unpacked
    sdist), a record names no commit: a git repository around it is the user's. The harness
    version is on every record, and records written before it was still read."""
    from xla_harness import __version__

    monkeypatch.setattr(provenance, "source_checkout", lambda: None)
    assert provenance.repo_commit() is None
    env = provenance.environment()
    assert env["repo_commit"] is None and env["harness_version"] == __version__
    (tmp_path / "sdist").mkdir()
    (tmp_path / "sdist" / "pyproject.toml").write_text('[project]\nname = "xla-harness"\n')
    monkeypatch.setattr(provenance, "source_checkout", lambda: tmp_path / "sdist")
    assert provenance.repo_commit() is None
    h = header()
    h["env"] = {**h["env"], "repo_commit": None, "harness_version": __version__}
    p = _write(tmp_path / "o", lines([h, block(0, 2)]))
    assert results.read_results(p).header.env["repo_commit"] is None
    _write(tmp_path / "old", GOOD)  # written before the version was recorded
    assert report.load_table([tmp_path / "o", tmp_path / "old"]).rows[0].n == 4


@pytest.mark.slow
def test_this_clone_records_its_commit(fresh_commit):
    if not (ROOT / ".git").exists() or provenance.source_checkout() != ROOT:
        pytest.skip("not run from this project's clone")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert provenance.repo_commit().removesuffix("+dirty") == head


@pytest.mark.parametrize("old,new,differs", [
    ({"commit": "step", "block": 10}, {"commit": "block", "block": None}, None),  # both count the same steps
    ({}, {"commit": "block"}, None),  # a file written before --commit existed
    ({"reference": False, "reference_every": 5}, {"reference": False, "reference_every": 1}, None),
    ({"reference": True, "reference_every": 5}, {"reference": True, "reference_every": 1},
     "reference_every=5, now 1"),
    ({"reference": False}, {"reference": True}, "reference=False, now True"),
])
def test_resume_may_change_how_often_steps_are_checked_not_what_is_measured(old, new, differs):
    assert results.spec_difference({**SPEC, **old}, {**SPEC, **new}) == differs


def test_nothing_is_fsynced_on_the_loop_s_thread_before_step_0(tmp_path, monkeypatch):
    """The results file's header (its first line, fsynced) is written by the results sink's thread, so
    the loop starts step 0 without waiting for a disk: every fsync before the step's first call runs
    on another thread, and the header is still the file's first line. Planted: the header written on
    the loop's thread is caught."""
    import threading

    from xla_harness.stress import runner
    from xla_harness.stress.proof.harness import Harnessed
    from xla_harness.stress.spec import StressSpec

    from ...helpers import TINY

    loop = threading.current_thread()
    fsyncs_on_loop: list[str] = []
    first_call: list[int] = []
    real_fsync, real_call, real_direct = os.fsync, Harnessed.call_step, Harnessed.direct_step

    def fsync(fd):
        if threading.current_thread() is loop and not first_call:
            fsyncs_on_loop.append("before step 0")
        return real_fsync(fd)

    def call_step(self, *args):
        first_call.append(1)
        return real_call(self, *args)

    def direct_step(self):  # what the block loop calls for the step
        run = real_direct(self)

        def call(*args):
            first_call.append(1)
            return run(*args)

        return call

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Harnessed, "call_step", call_step)
    monkeypatch.setattr(Harnessed, "direct_step", direct_step)
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=3, **TINY)
    path = runner.run_matrix(spec, tmp_path / "a")
    assert first_call and fsyncs_on_loop == []
    assert isinstance(records.parse_line(path.read_bytes().splitlines()[0]), records.Header)

    real_new_header = results.RunWriter.new_header

    def written_on_the_loop(self, spec, env):  # the old order: the header fsynced before step 0
        header = real_new_header(self, spec, env)
        self.append(header)
        return header

    monkeypatch.setattr(results.RunWriter, "new_header", written_on_the_loop)
    monkeypatch.setattr(runner.ResultsSink, "append",
                        lambda self, r, real=runner.ResultsSink.append: None if isinstance(r, records.Header)
                        else real(self, r))
    first_call.clear()
    runner.run_matrix(spec, tmp_path / "b")
    assert fsyncs_on_loop


def test_an_out_that_is_a_dangling_link_or_a_file_is_named_as_such(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(HarnessError, match="is a link to .*nowhere, which does not exist"):
        results.check_writable(link)
    (tmp_path / "file").write_text("mine\n")
    with pytest.raises(HarnessError, match="exists and is not a folder"):
        results.check_writable(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine\n" and not (tmp_path / "nowhere").exists()


def test_a_checkpoint_that_cannot_be_written_names_its_file_and_keeps_the_last_one(tmp_path, monkeypatch):
    import errno

    import jax.numpy as jnp
    import numpy as np

    from xla_harness.stress.loop import checkpoint

    path = tmp_path / "ckpt" / "c.npz"
    checkpoint.save_checkpoint(path, 3, {"w": jnp.ones(2)}, ())
    before = path.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(HarnessError, match=f"cannot write the checkpoint {path}: No space left on device"):
        checkpoint.save_checkpoint(path, 4, {"w": jnp.ones(2)}, ())
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["c.npz"]


def test_a_line_is_written_whole_or_not_at_all_when_the_disk_fills(tmp_path, monkeypatch):
    """A write that fails part-way (ENOSPC after half the line) is cut back: the file ends where it
    ended before, the error names it, and the next line (space freed) follows a complete one."""
    import errno

    p = tmp_path / "stress.jsonl"
    with results.open_run(p, dict(SPEC), resume=False) as w:
        w.write_header(dict(SPEC), {})
        before = p.read_bytes()
        real_write = os.write
        calls = []

        def fills(fd, data):
            calls.append(len(data))
            if len(calls) == 1:
                return real_write(fd, bytes(data[:len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", fills)
        with pytest.raises(HarnessError, match=f"cannot write results to {p}: No space left on device"):
            w.append(block(0, 5))
        assert p.read_bytes() == before and len(calls) == 2
        monkeypatch.setattr(os, "write", real_write)
        w.append(block(0, 5))
    lines = p.read_bytes().splitlines()
    assert p.read_bytes().startswith(before) and len(lines) == 2
    assert isinstance(records.parse_line(lines[1]), records.Block)
