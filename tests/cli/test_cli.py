"""CLI conventions: --version, --debug before or after the subcommand, every command's --help,
`scan -` (HLO text from standard input) and the stress progress line (terminal-sized, silent
off a terminal unless --progress)."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from xla_harness import __version__, cli
from xla_harness.cli import main
from xla_harness.commands import scan as scan_cmd
from xla_harness.stress import progress as progress_module

from ..helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]
HLO = ROOT / "tests" / "data" / "tied_sources.hlo"


# ----------------------------------------------------------------------------- --version


def test_version_names_harness_and_jax(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"xla-harness {__version__} (jax ")
    assert "jaxlib " in out and out.count("\n") == 1


@pytest.mark.slow
def test_version_does_not_import_jax():
    code = ("import sys; from xla_harness.cli import main; rc = main(['--version']); "
            "assert 'jax' not in sys.modules, 'jax imported'; raise SystemExit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"xla-harness {__version__}")



@pytest.mark.slow
def test_python_dash_m_runs_the_cli_from_the_source(tmp_path):
    """`python -m xla_harness` is the command, its exit codes included, with only the source on the
    path (as on a machine where the package is not installed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "xla_harness", "--version"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"xla-harness {__version__}")
    bad = subprocess.run([sys.executable, "-m", "xla_harness", "report", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- --debug


@pytest.mark.parametrize("argv", [["--debug", "report", "x"], ["report", "--debug", "x"], ["report", "x", "--debug"]])
def test_debug_anywhere_shows_the_traceback(argv, monkeypatch, capsys):
    from xla_harness.commands import report

    def boom(args):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(report, "run", boom)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == "error: internal: ZeroDivisionError: planted"


def test_debug_is_off_unless_given(monkeypatch, capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["--debug", "report", "x"]).debug is True
    assert parser.parse_args(["report", "x", "--debug"]).debug is True
    assert parser.parse_args(["report", "x"]).debug is False


# ----------------------------------------------------------------------------- --help


@pytest.mark.parametrize("modname", cli.SUBCOMMANDS)
def test_every_command_help_names_its_flags(modname, capsys):
    mod = importlib.import_module(modname)
    assert main([mod.NAME, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as one line: help text is wrapped
    assert "--debug" in out and "traceback" in out
    assert "--json" in out and "as JSON on stdout" in out  # every command that reports has --json
    if mod.NAME == "stress":
        assert "--progress" in out and "plain lines" in out
    if mod.NAME == "scan":
        assert "standard input" in out


# ----------------------------------------------------------------------------- scan -


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_scan_reads_stdin(monkeypatch, capsys):
    _stdin(monkeypatch, HLO.read_bytes())
    assert main(["scan", "-"]) == 0
    from_stdin = capsys.readouterr().out
    assert "(<stdin>)" in from_stdin and "scanned 1 module(s): 0 hazard(s)" in from_stdin
    assert main(["scan", str(HLO)]) == 0
    assert capsys.readouterr().out == from_stdin.replace("<stdin>", str(HLO))


def test_scan_stdin_with_a_file_and_json(monkeypatch, capsys):
    import json

    _stdin(monkeypatch, HLO.read_bytes())
    assert main(["scan", "--json", str(HLO), "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["modules"]) == 2


@pytest.mark.parametrize("data,argv,needle", [
    (b"HloModule m\n\xff\xfe\n", ["scan", "-"], "error: <stdin>:2: not UTF-8 text (byte 0xff at offset 12)"),
    (b"", ["scan", "-"], "error: <stdin>:1: "),
    (b"HloModule m\n", ["scan", "-", "-"], "error: - (standard input) is named more than once"),
])
def test_scan_stdin_bad_input_is_one_line(data, argv, needle, monkeypatch, capsys):
    _stdin(monkeypatch, data)
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(needle), err


def test_scan_stdin_is_bounded(monkeypatch, capsys):
    monkeypatch.setattr(scan_cmd, "STDIN_MAX_BYTES", 64)
    _stdin(monkeypatch, HLO.read_bytes())
    assert main(["scan", "-"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: <stdin>: more than 64 bytes of HLO text; refusing (scan a file instead)"]


def test_scan_stdin_terminal_is_refused(monkeypatch, capsys):
    class Tty(io.TextIOWrapper):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty(io.BytesIO(b"HloModule m\n")))
    assert main(["scan", "-"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "standard input is a terminal" in err[0]


# ----------------------------------------------------------------------------- stress progress


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def _event(done: int, total: int = 40, config_done: bool = False):
    return SimpleNamespace(kind="block", label="full/remat=on/f32-with-a-long-label", seed=1,
                           block=SimpleNamespace(start=done - 10, end=done), done_steps=done, total_steps=total,
                           nonfinite=0, config_done=config_done)


def _feed(bar) -> None:
    bar(SimpleNamespace(kind="compiled", label="full/remat=on/f32", fingerprint={"id": "x"}))
    for done in (10, 20, 30, 40):
        bar(_event(done, config_done=done in (20, 40)))
    bar.close()


@pytest.mark.parametrize("columns", [30, 80, 200])
def test_progress_on_a_terminal_fits_it(columns, monkeypatch):
    err = FakeTTY()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", str(columns))
    bar = progress_module.Progress("auto")
    _feed(bar)
    text = err.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1  # no blank line from close
    for piece in text.replace("\n", "\r").split("\r"):
        assert len(piece) < columns
    assert "40/40 steps" in text or columns < 40
    assert bar.fingerprints == {"full/remat=on/f32": {"id": "x"}}


def test_progress_width_follows_the_terminal_size(monkeypatch):
    err = FakeTTY()  # no fileno: falls back to shutil.get_terminal_size
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(progress_module.shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((50, 20)))
    _feed(progress_module.Progress("auto"))
    assert {len(p) for p in err.getvalue().replace("\n", "\r").split("\r") if p} == {49}


def test_progress_off_a_terminal_is_silent_unless_asked(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar = progress_module.Progress("auto")
    _feed(bar)
    assert err.getvalue() == "" and bar.fingerprints  # fingerprints are still collected
    lines = progress_module.Progress("lines")
    _feed(lines)
    text = err.getvalue()
    assert "\r" not in text and text.count("\n") == 2  # one line per finished configuration
    assert text.splitlines()[-1].startswith("[" + "#" * 24 + "] 40/40 steps")


def test_progress_lines_on_a_terminal_and_quiet(monkeypatch):
    err = FakeTTY()
    monkeypatch.setattr(sys, "stderr", err)
    _feed(progress_module.Progress("lines"))  # asked for log lines: plain lines even on a terminal
    assert "\r" not in err.getvalue() and err.getvalue().count("\n") == 2
    err.seek(0)
    err.truncate()
    _feed(progress_module.Progress("off"))
    assert err.getvalue() == ""


def test_progress_lines_between_configurations_every_so_often(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar = progress_module.Progress("lines")
    bar.LOG_EVERY_S = 0.0  # every event is "30 s later"
    _feed(bar)
    assert err.getvalue().count("\n") == 4


@pytest.mark.slow  # stress records the harness's git commit (a git subprocess)
def test_stress_progress_flag_end_to_end(tmp_path, capsys):
    argv = ["stress", "--modes", "full", "--remat", "on", "--seeds", "1", "--steps", "2", "--block", "1",
            *TINY_ARGS]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "steps/s" not in err  # stderr is not a terminal here: no progress by default
    assert main([*argv, "--out", str(tmp_path / "b"), "--progress"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "steps/s" in ln]
    assert lines and "2/2 steps" in lines[-1] and "\r" not in err  # (a 1/2 line too if compiling took 30 s)
    assert main([*argv, "--out", str(tmp_path / "c"), "--quiet", "--progress"]) == 2
    assert capsys.readouterr().err.count("error:") == 1
