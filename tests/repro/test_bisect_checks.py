"""#34 items 9, 11 and 12: the tools and the children the CLI starts keep the CLI's promises.

9.  bisect-passes --target with libtpu missing, a bad --program-option or a missing program printed only
    "listing passes failed: compiler exited 1": what it can check itself is checked before a probe
    starts, and a probe's own error line is passed on.
11. tools/publish_hlo.py deleted README.md (writing README.md.gz), replaced an existing .gz, blocked on
    a FIFO named like a dump, and gave tracebacks for binary files, corrupt .gz, a folder named like a
    dump and a link to /dev/zero. It checks every argument and dump before it writes anything.
12. make tpu-sweep checked entries one at a time as the loop reached them (a compile started before a
    later bad entry was refused) and SWEEP='jit=bogus' left an empty folder in results/.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError

from ..bad_input_cases import SMALL_HLO, SWEEP_ENV, Case, run_process

ROOT = Path(__file__).resolve().parents[2]
DUMP = "x.after_optimizations.txt"


def _publish():
    spec = importlib.util.spec_from_file_location("publish_hlo", ROOT / "tools" / "publish_hlo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else "other")
            for p in root.rglob("*")}


class Hung(BaseException):
    pass


def _alarm(signum, frame):
    raise Hung("publish_hlo still running after 30 s")


@pytest.mark.parametrize("files,arg,says", [
    ({"README.md": b"# notes\n"}, "README.md", "is not named like a compiler dump"),
    ({DUMP: SMALL_HLO, DUMP + ".gz": gzip.compress(b"committed", mtime=0)}, DUMP, ".gz already exists"),
    ({"d/" + DUMP: None}, "d", "is not a regular file"),
    ({DUMP: None}, DUMP, "is not a regular file"),
    ({DUMP: bytes(range(256)) * 4}, DUMP, "not UTF-8 text"),
    ({DUMP + ".gz": b"\x1f\x8b\x08\x00garbage"}, DUMP + ".gz", "gzip"),
    ({DUMP + ".gz": gzip.compress(SMALL_HLO, mtime=0)[:-12]}, DUMP + ".gz", "not a whole gzip stream"),
    ({"d/" + DUMP: "dir"}, "d", "is not a regular file"),
    ({"d/a.after_optimizations.txt": SMALL_HLO, "d/b.after_optimizations.txt": b"\xff\xfe"}, "d", "not UTF-8"),
], ids=["readme", "gz-exists", "fifo-in-folder", "fifo", "binary", "corrupt-gz", "truncated-gz", "folder-named-so",
        "one-bad-among-good"])
def test_publish_checks_every_file_before_it_writes_one(files, arg, says, tmp_path, capsys):
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            os.mkfifo(tmp_path / rel)
        elif data == "dir":
            (tmp_path / rel).mkdir()
        else:
            (tmp_path / rel).write_bytes(data)
    before = _tree(tmp_path)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        code = _publish()([str(tmp_path / arg)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and says in err[0], err
    assert _tree(tmp_path) == before


def test_publish_refuses_a_link_to_a_device(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    os.symlink("/dev/zero", tmp_path / "d" / DUMP)
    assert _publish()([str(tmp_path / "d")]) == 2
    assert "is not a regular file" in capsys.readouterr().err


def test_publish_still_scrubs_and_gzips_a_dump(tmp_path):
    body = "HloModule m\nENTRY e {\n  ROOT p = f32[4]{0} parameter(0)\n}\n\nFileNames\n1 \"/home/alice/x/y.py\"\n"
    (tmp_path / DUMP).write_text(body)
    assert _publish()([str(tmp_path)]) == 0
    assert not (tmp_path / DUMP).exists()
    assert gzip.decompress((tmp_path / (DUMP + ".gz")).read_bytes()).decode().endswith('1 "<path>/y.py"\n')
    assert _publish()([str(tmp_path)]) == 0  # a clean .gz stays as it is


# ----------------------------------------------------------------------------- item 12


@pytest.mark.slow
@pytest.mark.parametrize("sweep,cells,says", [
    ("jit=bare jit=bogus", "full:True", "option jit must be one of step, bare, nested, got 'bogus'"),
    ("jit=bogus", "full:True", "option jit must be"),
    ("jit=bare bogus", "full:True", "SWEEP entry 'bogus' is not KEY=VALUE"),
    ("layers=(1.5,2)", "full:True", "option layers must be"),
    ("jit=bare", "full:maybe", "option remat must be True or False, got 'maybe'"),
    ("jit=bare", "full", "SWEEP_CELLS entry 'full' is not MODE:REMAT"),
], ids=["later-bad-value", "bad-value", "later-not-key-value", "bad-layers", "bad-cell", "cell-not-mode-remat"])
def test_the_sweep_checks_every_entry_before_it_starts(sweep, cells, says, tmp_path):
    """Refused at once (no compile started: it would take seconds even at this size), and nothing created
    (jit=bogus left an empty folder in results/)."""
    case = Case("sweep", [], entry="sweep", env={**SWEEP_ENV, "SWEEP": sweep, "SWEEP_CELLS": cells})
    (tmp_path / "case").mkdir()
    code, _, _, err, seconds = run_process(case, tmp_path / "case", ROOT, 600)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err
    assert list((tmp_path / "case").iterdir()) == []
    assert seconds < 15, seconds


def test_the_options_check_the_sweep_runs(capsys):
    from xla_harness.programs.options import main as check

    assert check(["issue-35409", "mode=full", "remat=True", "jit=bare", "layers=(1,2)"]) == 0
    assert check(["issue-35409", "remat=maybe"]) == 2
    assert check(["issue-35409", "jit"]) == 2
    assert check(["tied-embedding"]) == 2  # its options come from the model flags
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: --program issue-35409: option remat must be True or False, got 'maybe'"
    assert err[1] == "error: expected KEY=VALUE, got 'jit'" and err[2].startswith("error: usage:")


# ----------------------------------------------------------------------------- item 9


@pytest.mark.slow
def test_a_probe_s_own_error_line_is_passed_on(tmp_path):
    """What the child said, not only its exit status: here a stand-in interpreter that says it."""
    from xla_harness.repro.bisect import SubprocessOracle

    fake = tmp_path / "python"
    said = "--program p.py:make: building the program raised ValueError: planted"
    fake.write_text(f"#!/bin/sh\necho 'error: {said}' >&2\nexit 2\n")
    fake.chmod(0o755)
    with pytest.raises(HarnessError) as got:
        SubprocessOracle({"program": "p.py:make"}, python=str(fake)).passes()
    assert str(got.value) == f"listing passes failed: {said}"
    fake.write_text("#!/bin/sh\necho 'jaxlib.JaxRuntimeError: INTERNAL: pass failed' >&2\nexit 1\n")
    with pytest.raises(HarnessError, match="baseline run failed: jaxlib.JaxRuntimeError: INTERNAL: pass failed"):
        SubprocessOracle({"program": "p.py:make"}, python=str(fake)).baseline(2)


@pytest.mark.slow
def test_a_program_that_cannot_be_built_is_named_by_the_probe(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("def make(**options):\n    raise ValueError('planted: this program cannot be built')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "xla_harness", "bisect-passes", "--quiet", "--oracle", "hlo", "--out",
                           str(tmp_path / "b"), "--program", f"{prog}:make"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.count("error:") == 1
    assert "listing passes failed: --program" in done.stderr and "ValueError: planted" in done.stderr
    assert not (tmp_path / "b").exists()  # nothing logged for a bisection that never started


@pytest.mark.parametrize("argv,says", [
    (["--program", "{tmp}/nothere.py:make"], "no such file"),
    (["--program", "issue-35409", "--program-option", "jit=bogus"], "option jit must be"),
], ids=["missing-program", "bad-option"])
def test_bisect_checks_what_it_can_before_a_probe_starts(argv, says, tmp_path, monkeypatch, capsys):
    from xla_harness.cli import main
    from xla_harness.repro import bisect

    monkeypatch.setattr(bisect.SubprocessOracle, "_call", lambda self, extra: pytest.fail("a probe started"))
    assert main(["bisect-passes", "--quiet", "--oracle", "hlo", "--out", str(tmp_path / "b"),
                 *[a.replace("{tmp}", str(tmp_path)) for a in argv]]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_bisect_names_a_missing_target_compiler_before_a_probe_starts(tmp_path, monkeypatch, capsys):
    from xla_harness.cli import main
    from xla_harness.repro import bisect
    from xla_harness.targets import devices

    monkeypatch.setattr(bisect.SubprocessOracle, "_call", lambda self, extra: pytest.fail("a probe started"))
    monkeypatch.setattr(devices, "missing", lambda target: f"--target {target.text} needs libtpu: planted")
    assert main(["bisect-passes", "--quiet", "--oracle", "hlo", "--target", "tpu:v6e:2x4", "--out",
                 str(tmp_path / "b")]) == 2
    assert "needs libtpu" in capsys.readouterr().err
