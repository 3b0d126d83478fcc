"""#34 items 2, 3 and 5: compile-only records, hlo/ and every output held to the promises of
stress results: one writer, every line validated, a torn tail repaired, nothing replaced, --resume
continuing only what it would have done itself, and every output path checked before anything runs.

2. A second --compile-only --resume with other --vocab/--d-model, --devices, XLA_FLAGS or versions
   said "every configuration is already recorded" (records matched on label and target only);
   --resume across a stress and a compile-only folder started a silent new run.
3. report --plot and scan --save-hlo replaced compile.jsonl, hlo/ files and lock files with
   --force; --compile-only --out D replaced D/hlo/ files; two --resume runs appended the same record
   (no lock); a torn last line made --resume fail for good; a bad record was ``error: internal:``.
5. stress --plot replaced a PNG without --force and refused a folder only after the whole run.
(Item 13, bundle: tests/repro/test_bundle_inputs.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError

from ...bad_input_cases import COMPILE_ENV, GOOD, ONE_CONFIG, SMALL_HLO, TINY_ARGS, compile_record, lines, stem

CO = ["stress", "--compile-only", "--quiet", *ONE_CONFIG, *TINY_ARGS]


@pytest.fixture
def compile_env(monkeypatch):
    for key, value in COMPILE_ENV.items():
        monkeypatch.setenv(key, value)


def _folder(tmp_path: Path, *records: dict, tail: bytes = b"") -> Path:
    co = tmp_path / "co"
    co.mkdir()
    (co / "compile.jsonl").write_bytes(lines(list(records)) + tail)
    return co


# ----------------------------------------------------------------------------- item 2: --resume


@pytest.mark.parametrize("extra,env,record,says", [
    (["--vocab", "128"], {}, {}, "options.vocab=64, now 128"),
    (["--d-model", "64"], {}, {}, "options.d_model=32, now 64"),
    (["--devices", "2"], {}, {}, "options.devices=1, now 2"),
    ([], {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}, {}, "compiled under other conditions (env.XLA_FLAGS="),
    ([], {}, {"versions": {"jax": "0.0.1", "jaxlib": "0.0.1"}}, "versions.jax='0.0.1', now"),
    (["--protocol", "frozen"], {}, {}, "protocol='train', now 'frozen'"),
], ids=["vocab", "d-model", "devices", "xla-flags", "versions", "protocol"])
def test_resume_refuses_records_compiled_from_other_inputs(extra, env, record, says, tmp_path, compile_env,
                                                           monkeypatch, capsys):
    """Everything that decides the compile is compared: the configuration's options, XLA_FLAGS and the
    other compiler variables, jax/jaxlib and compiler versions, the protocol; any difference is one
    line naming it (FILE:LINE), and nothing is compiled or written."""
    import jax

    from xla_harness.targets import compile as compile_mod

    jax.devices()  # this process's jax has started: XLA_FLAGS was read then (the run does not try it again)
    monkeypatch.setattr(compile_mod, "compile_step", lambda *a, **k: pytest.fail("compiled"))
    co = _folder(tmp_path, compile_record(**record))
    for key, value in env.items():
        monkeypatch.setenv(key, f"{os.environ.get(key, '')} {value}".strip())
    before = (co / "compile.jsonl").read_bytes()
    assert main([*CO, "--resume", "--out", str(co), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"{co}/compile.jsonl:1:" in err and says in err, err
    assert (co / "compile.jsonl").read_bytes() == before and not (co / "hlo").exists()


def test_resume_skips_a_record_compiled_from_the_same_inputs(tmp_path, compile_env, monkeypatch, capsys):
    from xla_harness.targets import compile as compile_mod

    monkeypatch.setattr(compile_mod, "compile_step", lambda *a, **k: pytest.fail("compiled again"))
    co = _folder(tmp_path, compile_record())
    assert main([*CO, "--resume", "--out", str(co)]) == 0
    assert "every configuration is already recorded" in capsys.readouterr().out


def test_records_written_before_the_inputs_were_recorded_still_resume(tmp_path, compile_env, monkeypatch, capsys):
    """A record from before protocol (and autotune) were recorded compares with the defaults: the
    committed matrices in results/ stay resumable."""
    from xla_harness.targets import compile as compile_mod

    monkeypatch.setattr(compile_mod, "compile_step", lambda *a, **k: pytest.fail("compiled again"))
    old = compile_record()
    del old["protocol"]
    co = _folder(tmp_path, old)
    assert main([*CO, "--resume", "--out", str(co)]) == 0


@pytest.mark.parametrize("argv,files,says", [
    (["stress", "--quiet", "--resume", "--out", "{co}", "--modes", "full", "--remat", "on", "--seeds", "1", "--steps",
      "2", *TINY_ARGS], {"compile.jsonl": lines([compile_record()])}, "holds stress --compile-only records"),
    (["stress", "--quiet", "--out", "{co}", "--steps", "2", *TINY_ARGS], {"compile.jsonl": lines([compile_record()])},
     "holds stress --compile-only records"),
    ([*CO, "--resume", "--out", "{co}"], {"stress.jsonl": GOOD}, "holds stress results"),
    ([*CO, "--out", "{co}"], {"stress.jsonl": GOOD}, "holds stress results"),
], ids=["stress-resume-on-compile", "stress-on-compile", "compile-resume-on-stress", "compile-on-stress"])
def test_one_folder_holds_one_kind_of_results(argv, files, says, tmp_path, capsys):
    co = tmp_path / "co"
    co.mkdir()
    for name, data in files.items():
        (co / name).write_bytes(data)
    assert main([a.replace("{co}", str(co)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and says in err
    assert sorted(p.name for p in co.iterdir()) == sorted(files)


# ----------------------------------------------------------------------------- item 3: protection


@pytest.mark.parametrize("name,bad,says", [
    ("cpu-seconds-word", compile_record(compile_cpu_s="slow"), "compile_cpu_s must be a number of seconds"),
    ("label-number", {**compile_record(), "label": 3}, "label must be a non-empty string"),
    ("versions-list", compile_record(versions=["0.12"]), "versions must be an object of version strings"),
    ("hazard-word", {**compile_record(), "scan": {**compile_record()["scan"], "hazard": "many"}},
     "scan.hazard must be a count"),
    ("fingerprint-list", compile_record(fingerprint=[1]), "fingerprint must be an object"),
    ("hlo-escapes", compile_record(hlo="../../x"), "hlo must be a path inside the results folder"),
    ("not-json", None, "not a JSON line"),
])
def test_every_line_of_compile_jsonl_is_validated(name, bad, says, tmp_path, capsys):
    """A hand-edited record is FILE:LINE and what is wrong with it (``compile_cpu_s: "slow"`` was an
    ``error: internal:``), for the report and for --resume alike."""
    co = tmp_path / "co"
    co.mkdir()
    middle = b"{not json\n" if bad is None else lines([bad])
    (co / "compile.jsonl").write_bytes(lines([compile_record("sparse_only/remat=on/f32")]) + middle
                                       + lines([compile_record("full/remat=off/f32")]))
    assert main(["report", str(co)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {co}/compile.jsonl:2: ") and says in err[0], err
    assert "internal" not in err[0]


def test_readers_leave_out_a_write_in_progress(tmp_path, capsys):
    co = _folder(tmp_path, compile_record(), tail=b'{"kind": "compile", "lab')
    assert main(["report", str(co)]) == 0
    assert "full/remat=on/f32" in capsys.readouterr().out


@pytest.mark.slow
def test_resume_repairs_a_torn_last_record_and_goes_on(tmp_path, compile_env, capsys):
    """The kill that cut the last line cost that compile only: --resume removes the cut line (with a
    warning), keeps every whole record, and compiles what is missing."""
    co = _folder(tmp_path, compile_record("sparse_only/remat=on/f32"), tail=b'{"kind": "compile", "la')
    assert main([*CO, "--resume", "--out", str(co)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "removed a truncated last line" in err and "error:" not in err
    got = [json.loads(ln)["label"] for ln in (co / "compile.jsonl").read_text().splitlines()]
    assert got == ["sparse_only/remat=on/f32", "full/remat=on/f32"]


def test_a_second_writer_is_refused(tmp_path, compile_env, monkeypatch, capsys):
    """One writer at a time (compile.jsonl.lock, as stress.jsonl's): two --resume runs appended the same
    record."""
    import fcntl

    from xla_harness.targets import compile as compile_mod

    monkeypatch.setattr(compile_mod, "compile_step", lambda *a, **k: pytest.fail("compiled"))
    co = _folder(tmp_path, compile_record("sparse_only/remat=on/f32"))
    with open(co / "compile.jsonl.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert main([*CO, "--resume", "--out", str(co)]) == 2
    assert "another stress run is writing" in capsys.readouterr().err


def test_compile_only_never_replaces_a_compiled_module(tmp_path, compile_env, monkeypatch, capsys):
    """A file already where a configuration would write its HLO is refused before anything compiles,
    in a new folder and on --resume alike (it overwrote 3 files of D/hlo/)."""
    from xla_harness.targets import compile as compile_mod

    monkeypatch.setattr(compile_mod, "compile_step", lambda *a, **k: pytest.fail("compiled"))
    hlo = tmp_path / "co" / "hlo" / f"{stem('full/remat=on/f32')}.after_optimizations-buffer-assignment.txt"
    hlo.parent.mkdir(parents=True)
    hlo.write_bytes(b"mine")
    assert main([*CO, "--out", str(tmp_path / "co")]) == 2
    assert f"{hlo} already exists" in capsys.readouterr().err
    assert hlo.read_bytes() == b"mine" and sorted(p.name for p in (tmp_path / "co").iterdir()) == ["hlo"]


def test_a_file_that_appears_while_compiling_is_not_replaced(tmp_path):
    from xla_harness.stress.compile_only.run import _write_new

    (tmp_path / "x.txt").write_text("mine")
    with pytest.raises(HarnessError, match="appeared while compiling"):
        _write_new(tmp_path / "x.txt", "compiled")
    assert (tmp_path / "x.txt").read_text() == "mine"


@pytest.mark.parametrize("target,says", [
    ("co/compile.jsonl", "is a results file"), ("co/compile.jsonl.lock", "the lock file of a results file"),
    ("a/stress.jsonl.lock", "the lock file of a results file"),
    (f"co/hlo/{stem('full/remat=on/f32')}.after_optimizations.txt", "a compiled module of the stress --compile-only"),
    ("a/ckpt/full_remat-on_f32_seed1.npz", "a checkpoint of the stress results"),
])
def test_no_output_replaces_a_results_file_its_lock_its_modules_or_checkpoints(target, says, tmp_path, capsys):
    """report --plot and scan --save-hlo with --force, onto what a results folder holds: refused."""
    for rel, data in {"a/stress.jsonl": GOOD, "a/stress.jsonl.lock": b"", "a/ckpt/full_remat-on_f32_seed1.npz": b"z",
                      "co/compile.jsonl": lines([compile_record()]), "co/compile.jsonl.lock": b"",
                      f"co/hlo/{stem('full/remat=on/f32')}.after_optimizations.txt": SMALL_HLO}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    before = (tmp_path / target).read_bytes()
    assert main(["report", str(tmp_path / "a"), "--plot", str(tmp_path / target), "--force"]) == 2
    assert says in capsys.readouterr().err
    assert main(["scan", "--model", "--save-hlo", str(tmp_path / target), "--force", *TINY_ARGS]) == 2
    assert says in capsys.readouterr().err
    assert (tmp_path / target).read_bytes() == before


# ----------------------------------------------------------------------------- item 5: stress --plot


@pytest.mark.parametrize("setup,plot,extra,says", [
    ({"keep.png": b"mine"}, "keep.png", [], "already exists; pass --force"),
    ({"d/x": b""}, "d", [], "is a folder"),
    ({"f": b"x"}, "f/x.png", [], "is not a folder"),
    ({"res/stress.jsonl": GOOD, "res/rates.png": b"earlier"}, "res/rates.png", ["--resume"],
     "already exists; pass --force"),
    ({"res/stress.jsonl": GOOD}, "res/stress.jsonl", ["--resume", "--force"], "one of this command's inputs"),
    ({"res/stress.jsonl": GOOD, "res/stress.jsonl.lock": b""}, "res/stress.jsonl.lock", ["--force"], "lock file"),
], ids=["existing", "folder", "under-a-file", "resume-existing", "its-input", "lock"])
def test_stress_plot_is_checked_before_anything_runs(setup, plot, extra, says, tmp_path, monkeypatch, capsys):
    from xla_harness.stress import runner

    monkeypatch.setattr(runner, "run_matrix", lambda *a, **k: pytest.fail("the run started"))
    for rel, data in setup.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["stress", "--quiet", "--out", str(tmp_path / "res"), "--modes", "full", "--remat", "on", "--seeds",
                 "1", "--steps", "4", "--block", "2", *TINY_ARGS, "--plot", str(tmp_path / plot), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and says in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_stress_plot_with_force_replaces_an_earlier_plot(tmp_path):
    (tmp_path / "rates.png").write_bytes(b"earlier")
    assert main(["stress", "--quiet", "--out", str(tmp_path / "o"), "--modes", "full", "--remat", "on", "--seeds", "1",
                 "--steps", "2", *TINY_ARGS, "--plot", str(tmp_path / "rates.png"), "--force"]) == 0
    assert (tmp_path / "rates.png").read_bytes().startswith(b"\x89PNG")
