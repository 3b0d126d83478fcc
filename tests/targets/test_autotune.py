"""GPU autotune results: `--autotune-results FILE` puts XLA's load flag into XLA_FLAGS before the
compile (and the cuda: compile reads it: a malformed file is refused by XLA itself), a file that is not
there or cannot be read is one error line and exit 2, and a compile on a real GPU asks XLA to write the
device's choices beside its HLO (no GPU here: the choice of path is tested on device stand-ins)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.targets import HOST, Target
from xla_harness.targets import devices as target_devices
from xla_harness.targets.devices import LOAD_AUTOTUNE_FLAG, autotune_dump_path, load_autotune_results, missing

ROOT = Path(__file__).resolve().parents[2]
H200 = Target("cuda", "h200", "1x1x1")
QUICKSTART = str(ROOT / "examples" / "quickstart" / "my_model.py") + ":make"


def test_the_file_goes_into_xla_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_hlo_as_text")
    f = tmp_path / "h200.autotune.txt"
    f.write_text("")
    load_autotune_results(f, H200)
    assert os.environ["XLA_FLAGS"] == f"--xla_dump_hlo_as_text --{LOAD_AUTOTUNE_FLAG}={f.resolve()}"
    with pytest.raises(HarnessError, match="XLA_FLAGS already names a file"):
        load_autotune_results(f, H200)


@pytest.mark.parametrize("make,says", [
    (lambda p: p / "none.txt", "no such file"),
    (lambda p: p, "not a regular file"),
])
def test_a_file_that_is_not_there_is_refused(tmp_path, monkeypatch, make, says):
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(HarnessError, match=says):
        load_autotune_results(make(tmp_path), H200)
    assert os.environ["XLA_FLAGS"] == ""


def test_an_unreadable_file_is_refused(tmp_path, monkeypatch):
    f = tmp_path / "r.txt"
    f.write_text("")
    real_open = open

    def deny(path, *a, **k):
        if Path(path) == f:
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(HarnessError, match="cannot read: Permission denied"):
        load_autotune_results(f, H200)


def test_targets_without_a_gpu_autotuner_are_refused(tmp_path, monkeypatch):
    f = tmp_path / "r.txt"
    f.write_text("")
    with pytest.raises(HarnessError, match="tpu:v6e:2x4 has no GPU autotuner"):
        load_autotune_results(f, Target("tpu", "v6e", "2x4"))
    monkeypatch.setattr("glob.glob", lambda pattern: [])
    with pytest.raises(HarnessError, match="this host has no GPU"):
        load_autotune_results(f, HOST)
    monkeypatch.setattr("glob.glob", lambda pattern: ["/dev/nvidia0"])  # a GPU host takes it
    monkeypatch.setenv("XLA_FLAGS", "")
    load_autotune_results(f, HOST)
    assert LOAD_AUTOTUNE_FLAG in os.environ["XLA_FLAGS"]


@pytest.mark.parametrize("argv,says", [
    (["stress", "--compile-only", "--target", "cuda:h200:1x1x1"], "--autotune-results {f}: no such file"),
    (["scan", "--model", "--target", "cuda:h200:1x1x1"], "--autotune-results {f}: no such file"),
    (["scan", "x.hlo"], "--autotune-results needs --model"),
])
def test_cli_says_what_is_wrong_in_one_line(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.setenv("XLA_FLAGS", "")
    f = tmp_path / "none.textproto"
    assert main([*argv, "--autotune-results", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and says.format(f=f) in err and "Traceback" not in err


def test_a_real_gpu_compile_writes_its_autotune_results_beside_the_hlo():
    """Only a device's compile has an autotuner: its devices get a path, a topology's (ahead of time) and
    the CPU's none."""
    class Client:  # a real backend's client
        pass

    class CompileOnlyPyClient:  # what get_topology_desc's devices hold
        pass

    gpu = SimpleNamespace(platform="gpu", client=Client())
    assert autotune_dump_path([gpu], "out/hlo/host-x") == "out/hlo/host-x.autotune.txt"
    assert autotune_dump_path([SimpleNamespace(platform="gpu", client=CompileOnlyPyClient())], "s") is None
    assert autotune_dump_path([SimpleNamespace(platform="cpu", client=Client())], "s") is None
    assert autotune_dump_path([], "s") is None


@pytest.mark.slow
def test_compile_matrix_asks_the_compile_for_the_dump_and_records_it(tmp_path, monkeypatch):
    """On a GPU (stood in for: the dump path is granted and the compile writes the file XLA would),
    the compile gets xla_gpu_dump_autotune_results_to for its own file and the record names it."""
    from xla_harness.stress.compile_only import run as compile_only
    from xla_harness.stress.spec import StressSpec
    from xla_harness.targets import compile as compile_mod

    seen = {}
    real = compile_mod.compile_step

    def recording(program, target, devices, **kw):
        seen.update(kw)
        result = real(program, target, devices, program_name=kw.get("program_name"))
        Path(kw["autotune_to"]).write_text("")  # what XLA writes on a device
        return result

    monkeypatch.setattr(target_devices, "autotune_dump_path", lambda devices, stem: f"{stem}.autotune.txt")
    monkeypatch.setattr(compile_mod, "compile_step", recording)
    spec = StressSpec(program=QUICKSTART)
    [rec] = list(compile_only.compile_matrix(spec, HOST, out=tmp_path))
    assert seen["autotune_to"].endswith(".autotune.txt")
    assert rec.record["autotune_results"] == str(Path(seen["autotune_to"]).relative_to(tmp_path))
    assert json.loads((tmp_path / "compile.jsonl").read_text())["autotune_results"] == rec.record["autotune_results"]


@pytest.mark.slow
@pytest.mark.skipif(missing(H200) is not None, reason=str(missing(H200)))
def test_the_cuda_compile_reads_the_file(tmp_path):
    """The flag reaches the compile: XLA itself reads the file (a malformed one is XLA's error, one line);
    a well-formed one compiles, and the record's XLA_FLAGS names it."""
    bad = tmp_path / "bad.textproto"
    bad.write_text("garbage {\n")
    argv = [sys.executable, "-m", "xla_harness", "stress", "--compile-only", "--target", "cuda:h200:1x1x1",
            "--program", QUICKSTART, "--quiet", "--autotune-results"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": ""}
    done = subprocess.run([*argv, str(bad)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Failed to parse autotune results" in errors[0]
    empty = tmp_path / "empty.textproto"
    empty.write_text("")
    done = subprocess.run([*argv, str(empty), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "out" / "compile.jsonl").read_text())
    assert record["XLA_FLAGS"] == f"--{LOAD_AUTOTUNE_FLAG}={empty.resolve()}"
    assert "autotune_results" not in record  # ahead of time no autotuner runs, so nothing is written


def test_compile_step_hands_the_dump_path_to_this_compile_only(monkeypatch, tmp_path):
    import jax

    from xla_harness.programs.interface import load_program
    from xla_harness.targets.compile import compile_step
    from xla_harness.targets.devices import DUMP_AUTOTUNE_FLAG

    options = []
    real = jax.stages.Lowered.compile

    def recording(self, compiler_options=None, **kw):
        options.append(dict(compiler_options or {}))
        return real(self, compiler_options=compiler_options, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", recording)
    program = load_program(QUICKSTART)
    compile_step(program, HOST, jax.devices(), autotune_to=str(tmp_path / "a.autotune.txt"))
    compile_step(program, HOST, jax.devices())
    assert options[0][DUMP_AUTOTUNE_FLAG] == str(tmp_path / "a.autotune.txt")
    assert DUMP_AUTOTUNE_FLAG not in options[1]


def test_a_path_with_spaces_goes_into_xla_flags_quoted_and_is_read_back(tmp_path, monkeypatch):
    """XLA splits XLA_FLAGS at white space outside double quotes: a path with a space goes in quoted
    (unquoted, XLA would read '/x/with' and refuse 'space.txt'), and the compile record's hash reads
    the same file back; a path XLA_FLAGS cannot carry is refused."""
    from xla_harness.stress.compile_only.run import _autotune_sha256
    from xla_harness.targets.devices import flag_path

    folder = tmp_path / "with space"
    folder.mkdir()
    f = folder / "results.txt"
    f.write_text("autotune\n")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_hlo_as_text")
    load_autotune_results(f, H200)
    flags = os.environ["XLA_FLAGS"]
    assert f'--{LOAD_AUTOTUNE_FLAG}="{f.resolve()}"' in flags
    assert flag_path(flags, LOAD_AUTOTUNE_FLAG) == str(f.resolve())
    assert _autotune_sha256() is not None
    bad = tmp_path / 'a"b.txt'
    bad.write_text("x\n")
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(HarnessError, match="double quote"):
        load_autotune_results(bad, H200)
    assert os.environ["XLA_FLAGS"] == ""
