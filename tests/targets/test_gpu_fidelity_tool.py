"""tools/gpu_fidelity.py (``make gpu-fidelity``) keeps the project's promises on bad input: one ``error:``
line on stderr and exit 2 (argparse's own errors too), no traceback, every input and output checked before
the first compile or write, and nothing replaced or deleted that the tool did not make (an existing
table.md or fidelity.json only with --force; an OUT/aot only when it is an earlier compile of the tool's
own, with --force). The compile needs the CUDA plugin, which these tests do not: every refusal here comes
before it, and the in-process tests stand a fake compile in for the real one."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hlo.test_fidelity import DEVICE, _compile_folder

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_fidelity.py"
HLO = "hlo/m.after_optimizations.txt"


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


def _refused(done: subprocess.CompletedProcess, cause: str) -> None:
    """Exit 2, one ``error:`` line naming ``cause`` (and nothing argparse or Python would print)."""
    err = done.stderr
    assert done.returncode == 2, done.stdout + err
    assert "Traceback" not in err and "usage:" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert cause in lines[0], err


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def device(tmp_path: Path) -> Path:
    return _compile_folder(tmp_path / "device", DEVICE, 100)


@pytest.fixture
def user_aot(tmp_path: Path) -> Path:
    """The repro's folder: gk/aot holding a file of the user's own."""
    (tmp_path / "gk" / "aot").mkdir(parents=True)
    (tmp_path / "gk" / "aot" / "m.txt").write_text("mine\n")
    return tmp_path / "gk"


# 1. --out that is not a folder
@pytest.mark.slow
@pytest.mark.parametrize("name,content", [("notes.txt", "mine\n"), ("compile.jsonl", '{"kind": "compile"}\n')])
def test_an_out_that_is_a_file_is_refused(tmp_path, device, name, content):
    out = tmp_path / name
    out.write_text(content)
    done = _run(tmp_path, "--device", str(device), "--aot", str(device), "--out", str(out))
    _refused(done, "not a folder")
    assert out.read_text() == content


@pytest.mark.slow
@pytest.mark.parametrize("inside", [".", "hlo"])
def test_an_out_inside_the_device_folder_is_refused(tmp_path, device, inside):
    before = _snapshot(tmp_path)
    done = _run(tmp_path, "--device", str(device), "--out", str(device / inside), "--force")
    _refused(done, "is inside --device")
    assert _snapshot(tmp_path) == before and sorted(p.name for p in device.iterdir()) == ["compile.jsonl", "hlo"]


# 2. a device HLO that cannot be read
@pytest.mark.slow
@pytest.mark.parametrize("suffix,data,cause", [
    (".gz", b"\x1f\x8b\x08\x00garbage", "gzip"),
    (".gz", gzip.compress(DEVICE.encode(), mtime=0)[:-12], "gzip"),
    (".gz", DEVICE.encode(), "gzip"),
    ("", b"HloModule m\n\xff\xfe\n", "UTF-8"),
    (".gz", gzip.compress(b"\xff\xfe" * 8, mtime=0), "UTF-8"),
], ids=["corrupt-gz", "truncated-gz", "not-gzip", "non-utf8", "gz-of-non-utf8"])
def test_a_device_hlo_that_cannot_be_read_is_one_error_line(tmp_path, device, suffix, data, cause):
    (device / HLO).unlink()
    bad = device / (HLO + suffix)
    bad.write_bytes(data)
    done = _run(tmp_path, "--device", str(device), "--aot", str(device), "--out", str(tmp_path / "out"))
    _refused(done, cause)
    assert bad.name in done.stderr and not (tmp_path / "out").exists()


# 3. nothing is deleted: a bad target, a missing autotune file, an OUT/aot the tool did not make
@pytest.mark.slow
@pytest.mark.parametrize("extra,cause", [
    (["--target", "cuda:b200"], "unknown GPU kind 'b200'"),
    (["--autotune-results", "nowhere.txt"], "nowhere.txt: no such file"),
    ([], "--force"),
    (["--force"], "m.txt"),
], ids=["bad-target", "missing-autotune", "aot-exists", "aot-exists-forced"])
def test_a_users_out_aot_is_never_deleted(tmp_path, device, user_aot, extra, cause):
    before = _snapshot(tmp_path)
    done = _run(tmp_path, "--device", str(device), "--out", str(user_aot), *extra)
    _refused(done, cause)
    assert (user_aot / "aot" / "m.txt").read_text() == "mine\n"
    assert _snapshot(tmp_path) == before and sorted(p.name for p in user_aot.iterdir()) == ["aot"]


@pytest.mark.slow
def test_the_device_folder_is_never_out_aot(tmp_path):
    device = _compile_folder(tmp_path / "gk" / "aot", DEVICE, 100)
    before = _snapshot(tmp_path)
    _refused(_run(tmp_path, "--device", str(device), "--out", str(tmp_path / "gk"), "--force"), "--device")
    assert _snapshot(tmp_path) == before


# 4. only a cuda: target
@pytest.mark.slow
@pytest.mark.parametrize("target", ["tpu:v6e:2x4", "host"])
def test_a_target_other_than_cuda_is_refused(tmp_path, device, target):
    done = _run(tmp_path, "--device", str(device), "--out", str(tmp_path / "out"), "--target", target)
    _refused(done, "cuda:")
    assert target in done.stderr and not (tmp_path / "out").exists()


# 5. an existing table or data file only with --force, checked before any compile
@pytest.mark.slow
@pytest.mark.parametrize("name", ["table.md", "fidelity.json"])
@pytest.mark.parametrize("compare", ["aot", "compile"])
def test_an_existing_table_needs_force(tmp_path, device, name, compare):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("mine\n")
    aot = ["--aot", str(device)] if compare == "aot" else []
    done = _run(tmp_path, "--device", str(device), "--out", str(out), *aot)
    _refused(done, f"{out / name} already exists; pass --force")
    assert (out / name).read_text() == "mine\n" and sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.slow
def test_force_replaces_an_earlier_table(tmp_path, device):
    out = tmp_path / "out"
    out.mkdir()
    (out / "table.md").write_text("old\n")
    done = _run(tmp_path, "--device", str(device), "--aot", str(device), "--out", str(out), "--force")
    assert done.returncode == 0, done.stderr
    assert "| temp bytes (buffer assignment) | 100 | 100 |" in (out / "table.md").read_text()
    assert json.loads((out / "fidelity.json").read_text())["matched_fusions"] == [3, 3, 3]


# 6. usage errors are one error line, exit 2
@pytest.mark.slow
@pytest.mark.parametrize("argv,cause", [
    ([], "--device"),
    (["--device", "d", "--out", "o", "--bogus"], "--bogus"),
    (["--device", "d", "--out"], "--out"),
    (["--device", "", "--out", "o"], "argument --device: an empty path"),
    (["--device", "d", "--out", ""], "argument --out: an empty path"),
], ids=["no-flags", "unknown-flag", "flag-without-value", "empty-device", "empty-out"])
def test_a_usage_error_is_one_error_line(tmp_path, argv, cause):
    _refused(_run(tmp_path, *argv), cause)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_help_still_prints_usage(tmp_path):
    done = _run(tmp_path, "--help")
    assert done.returncode == 0 and "--force" in done.stdout and not done.stderr


# flags the comparison of an existing folder cannot use
@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--target", "cuda:h100"], ["--autotune-results", "a.txt"]])
def test_aot_compiles_nothing_so_takes_no_compile_flags(tmp_path, device, extra):
    (tmp_path / "a.txt").write_text("x\n")
    done = _run(tmp_path, "--device", str(device), "--aot", str(device), "--out", str(tmp_path / "out"), *extra)
    _refused(done, extra[0])


# the swap: an earlier compile of the tool's own is replaced only after the new one is there
@pytest.fixture
def tool(monkeypatch):
    """The tool's module, on a machine where the CUDA plugin counts as installed."""
    from xla_harness.targets import devices

    monkeypatch.setattr(devices, "missing", lambda target: None)
    spec = importlib.util.spec_from_file_location("gpu_fidelity_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_compile(temp: int, fail: bool = False):
    def compile_into(dest: Path, target, options, autotune) -> None:
        from xla_harness.errors import HarnessError

        dest.mkdir()
        (dest / "partial.txt").write_text("half\n")
        if fail:
            raise HarnessError("the ahead-of-time compile failed (exit 2)")
        (dest / "partial.txt").unlink()
        _compile_folder(dest, DEVICE, temp)
    return compile_into


def test_a_missing_cuda_plugin_is_refused_before_anything(tmp_path, device, tool, monkeypatch, capsys):
    from xla_harness.targets import devices

    monkeypatch.setattr(devices, "missing", lambda target: f"--target {target.text} needs the CUDA plugin")
    monkeypatch.setattr(tool, "_run_compile", _fake_compile(90))
    assert tool.main(["--device", str(device), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "cuda:h200:1x1x1 needs the CUDA plugin" in err
    assert not (tmp_path / "out").exists()


def test_force_replaces_an_earlier_compile_of_its_own(tmp_path, device, tool, monkeypatch, capsys):
    out = tmp_path / "out"
    _compile_folder(out / "aot", DEVICE, 50)
    (out / "aot" / "compile.jsonl.lock").write_text("")
    monkeypatch.setattr(tool, "_run_compile", _fake_compile(90))
    assert tool.main(["--device", str(device), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert tool.main(["--device", str(device), "--out", str(out), "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["aot", "fidelity.json", "table.md"]
    assert "| temp bytes (buffer assignment) | 100 | 90 |" in (out / "table.md").read_text()
    assert '"temp_size_in_bytes": 90' in (out / "aot" / "compile.jsonl").read_text()


def test_a_failed_compile_leaves_the_earlier_one_in_place(tmp_path, device, tool, monkeypatch, capsys):
    out = tmp_path / "out"
    _compile_folder(out / "aot", DEVICE, 50)
    (out / "table.md").write_text("old\n")
    before = _snapshot(tmp_path)
    monkeypatch.setattr(tool, "_run_compile", _fake_compile(90, fail=True))
    assert tool.main(["--device", str(device), "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "compile failed" in err
    assert _snapshot(tmp_path) == before and sorted(p.name for p in out.iterdir()) == ["aot", "table.md"]


def test_a_failed_compile_into_a_new_out_leaves_nothing(tmp_path, device, tool, monkeypatch, capsys):
    monkeypatch.setattr(tool, "_run_compile", _fake_compile(90, fail=True))
    assert tool.main(["--device", str(device), "--out", str(tmp_path / "new" / "out")]) == 2
    assert capsys.readouterr().err.count("error:") == 1
    assert not (tmp_path / "new" / "out").exists()


def _other_program(aot: Path) -> None:
    rec = json.loads((aot / "compile.jsonl").read_text())
    (aot / "compile.jsonl").write_text(json.dumps({**rec, "label": "mine", "program": "mine.py:prog"}) + "\n")


def _notes_in_hlo(aot: Path) -> None:
    (aot / "hlo" / "notes.txt").write_text("mine\n")


@pytest.mark.parametrize("change,cause", [(_other_program, "a compile of mine for cuda:h200:1x1x1"),
                                          (_notes_in_hlo, "holds hlo/notes.txt")], ids=["other-program", "notes"])
def test_force_never_replaces_a_compile_folder_of_another_kind(tmp_path, device, tool, monkeypatch, capsys,
                                                                change, cause):
    out = tmp_path / "out"
    change(_compile_folder(out / "aot", DEVICE, 50))
    before = _snapshot(tmp_path)
    monkeypatch.setattr(tool, "_run_compile", _fake_compile(90))
    assert tool.main(["--device", str(device), "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and cause in err and "no compile of this tool made" in err
    assert _snapshot(tmp_path) == before and sorted(p.name for p in out.iterdir()) == ["aot"]
