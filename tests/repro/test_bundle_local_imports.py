"""A program split over files: the bundle carries the modules the program imported from its own folder
(not the folder), and the bundle replays from a clean folder elsewhere. Planted: the sibling left out."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.programs.interface import load_program
from xla_harness.repro import bundle as bundle_mod

ROOT = Path(__file__).resolve().parents[2]

MODEL = '''
import jax
import jax.numpy as jnp


def init_params(key, width):
    return {"w": jax.random.normal(key, (4, width)), "v": jnp.zeros((width,))}


def loss(params, b):
    y = jnp.tanh(b["x"] @ params["w"]) @ params["v"]
    return jnp.mean((y - 1.0) ** 2) + jnp.where(b["poison"], jnp.nan, 0.0)
'''

WRAPPER = '''
import jax
import optax

from mymodel import init_params, loss
from xla_harness.programs.interface import TrainProgram, step_from_loss


def make(width=8, poison=0.5):
    opt = optax.sgd(0.1)

    def init(key):
        params = init_params(key, width)
        return params, opt.init(params)

    def batch(key, step):
        kx, kp = jax.random.split(key)
        return {"x": jax.random.normal(kx, (16, 4)), "poison": jax.random.uniform(kp) < poison}

    return TrainProgram(name="two-file", init=init, batch=batch, step=step_from_loss(loss, opt),
                        options={"width": width})
'''


@pytest.fixture
def clean_imports(tmp_path, monkeypatch):
    """sys.path as it was, and no module of tmp_path left in sys.modules (another test's ``mymodel``)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.fixture
def two_file(tmp_path, clean_imports):
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "mymodel.py").write_text(MODEL)
    (folder / "program.py").write_text(WRAPPER)
    return folder


def test_local_modules_are_what_the_program_imported_from_its_folder(tmp_path, clean_imports):
    folder = tmp_path / "home"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "layers.py").write_text("SCALE = 2\n")
    (folder / "helper.py").write_text("OFFSET = 1\n")
    (folder / "unused.py").write_text("raise SystemExit('never imported')\n")
    (folder / "data.bin").write_bytes(b"\0" * 100_000)  # in the folder, not imported: not carried
    site = folder / ".venv" / "lib" / "site-packages"  # an installed package under a home folder
    site.mkdir(parents=True)
    (site / "installedthing.py").write_text("X = 3\n")
    (folder / "prog.py").write_text(
        "import sys\n"
        f"sys.path.append({str(site)!r})\n"
        "import helper, installedthing\n"
        "from pkg.layers import SCALE\n"
        "from xla_harness.programs.interface import TrainProgram\n"
        "def make():\n"
        "    return TrainProgram(name='p', init=None, batch=None, step=None)\n")
    load_program(f"{folder / 'prog.py'}:make")
    found = bundle_mod.local_modules(folder / "prog.py")
    assert sorted(found) == ["helper.py", "pkg/__init__.py", "pkg/layers.py", "prog.py"]
    assert found["pkg/layers.py"] == (folder / "pkg" / "layers.py").resolve()


def test_local_modules_past_the_cap_are_one_error_naming_the_largest(two_file, monkeypatch):
    load_program(f"{two_file / 'program.py'}:make")
    assert sorted(bundle_mod.local_modules(two_file / "program.py")) == ["mymodel.py", "program.py"]
    monkeypatch.setattr(bundle_mod, "MAX_PROGRAM_BYTES", 100)
    with pytest.raises(HarnessError, match=r"2 files of \d+ bytes, more than a bundle carries .*largest: "
                                           r"(mymodel|program)\.py"):
        bundle_mod.local_modules(two_file / "program.py", "program.py:make")


def _replay(folder):
    """repro.py run in ``folder`` as a user would: no PYTHONPATH, that folder the working one."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "repro.py", "--json"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_a_two_file_program_bundle_replays_in_a_clean_folder_elsewhere(two_file, tmp_path, capsys):
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", "--program", f"{two_file / 'program.py'}:make", "--steps", "6", "--seeds", "3",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    with tarfile.open(out) as tf:
        names = tf.getnames()
    assert "bundle/program/mymodel.py" in names and "bundle/program/program.py" in names
    # The bundle alone: extracted elsewhere, the program's own folder gone.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with tarfile.open(out) as tf:
        tf.extractall(elsewhere, filter="data")
    shutil.move(two_file, tmp_path / "gone")
    ran = _replay(elsewhere / "bundle")
    assert ran.returncode == 0, ran.stderr
    got = json.loads([ln for ln in ran.stdout.splitlines() if ln.startswith("{")][-1])
    expected = json.loads((elsewhere / "bundle" / "expected.json").read_text())
    assert got["seeds"] == expected["seeds"] and got["seeds"]["3"]["nonfinite"] > 0  # its planted NaNs
    assert main(["bundle", "--check", str(out), "--run-program"]) == 0
    assert "-> same" in capsys.readouterr().out
    # Planted: the sibling left out of the copy; the same replay fails and names the module.
    (elsewhere / "bundle" / "program" / "mymodel.py").unlink()
    broken = _replay(elsewhere / "bundle")
    assert broken.returncode != 0 and "No module named 'mymodel'" in broken.stderr


@pytest.mark.slow
def test_a_bundle_without_the_sibling_is_caught_when_made(two_file, tmp_path, monkeypatch, capsys):
    """Planted: the collection misses the sibling (as before it existed). The bundle's own replay, run
    from the bundle's folder, fails on it: one error line naming the module, exit 2, no bundle written."""
    monkeypatch.setattr(bundle_mod, "local_modules", lambda src, program="": {src.name: src})
    out = tmp_path / "b.tar.gz"
    rc = main(["bundle", "--program", f"{two_file / 'program.py'}:make", "--steps", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "No module named 'mymodel'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow
def test_bisect_passes_probes_import_the_programs_sibling(two_file, tmp_path, monkeypatch, capsys):
    """Each probe is a fresh process started elsewhere: the program's folder is importable in it."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rc = main(["bisect-passes", "--program", f"{two_file / 'program.py'}:make", "--oracle", "hlo",
               "--property", "multi-op-fusion", "--passes", "algsimp,fusion", "--out", str(tmp_path / "b"),
               "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "removes the failure: fusion\n" in captured.out


@pytest.mark.slow
def test_triage_of_a_two_file_program_with_a_planted_nan_names_the_steps_and_bundles_what_replays(tmp_path):
    """The issue's end to end: a model file and a wrapper importing it, a NaN the loss puts in on about
    a tenth of the steps (a flag drawn in the batch): triage exits 1 with the steps, the replay command
    and whose the NaN is (the program's, at the model file's line: no compiler is bisected, no bundle
    made for one), and the bundle of its results, copied to a clean folder with the user's folder
    gone, replays there."""
    import shlex

    from xla_harness.cli import build_parser

    user = tmp_path / "user"
    user.mkdir()
    (user / "mymodel.py").write_text(MODEL)
    (user / "program.py").write_text(WRAPPER)
    out = tmp_path / "t"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "xla_harness", "triage", "--program", f"{user}/program.py:make",
                           "--program-option", "poison=0.1", "--out", str(out), "--budget", "20"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Where (" in done.stdout and "non-finite:" in done.stdout, done.stdout
    replay = next(line.strip() for line in done.stdout.splitlines() if line.strip().startswith("xla-harness stress "))
    args = build_parser().parse_args(shlex.split(replay)[1:])
    assert args.program == f"{user}/program.py:make" and len(args.seeds) == 1
    origins = json.loads((out / "triage.json").read_text())["stages"]
    assert "skipped" in origins["bisect"] and not (out / "repro.tar.gz").exists()
    line = next(i for i, text in enumerate(MODEL.splitlines(), 1) if "jnp.nan" in text)
    assert f"from your program's own math (select_n made NaN at {user}/mymodel.py:{line}" in done.stdout
    bundle = out / "repro.tar.gz"
    rounds = origins["train"]["rounds"]
    made = subprocess.run([sys.executable, "-m", "xla_harness", "bundle", "--program", f"{user}/program.py:make",
                           "--program-option", "poison=0.1", "--results", str(out / rounds[0]), "--out", str(bundle)],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    assert bundle.is_file()
    with tarfile.open(bundle) as tf:
        assert any(n.endswith("program/mymodel.py") for n in tf.getnames()), tf.getnames()
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy(bundle, clean / "repro.tar.gz")
    shutil.move(str(user), str(tmp_path / "gone"))
    check = subprocess.run([sys.executable, "-m", "xla_harness", "bundle", "--check", str(clean / "repro.tar.gz"),
                            "--run-program"], capture_output=True, text=True, timeout=900, cwd=clean, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
