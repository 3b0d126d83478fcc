"""The program interface end to end: the harness runs the user's step unchanged (fingerprint and
XLA's own buffer-assignment dump), and a foreign program file works with every command."""

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import jax
import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.programs.interface import TrainProgram, load_program
from xla_harness.stress.device.inject import step_keys
from xla_harness.stress.proof.fingerprint import fingerprint, normalise_hlo_text, plain_jit
from xla_harness.stress.report import stats
from xla_harness.stress.results import store as results
from xla_harness.stress.runner import check_same_program, initial_state, prepare
from xla_harness.stress.spec import StressSpec

from ..helpers import FOREIGN_PROGRAM, TINY, TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "my_model.py"
    path.write_text(FOREIGN_PROGRAM)
    return path


def _poisoned(path, seed, steps):
    prog = load_program(f"{path}:make", width=8)
    return [s for s in range(steps) if bool(prog.batch(step_keys(seed, s)[0], s)["poison"])]


def _cli(*args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "xla_harness.cli", *args], env=env, capture_output=True, text=True,
                          timeout=900)


# ----------------------------------------------------------------------------- same program


@pytest.mark.slow
def test_harness_step_has_the_fingerprint_of_a_plain_jit():
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=1, **TINY)
    h = prepare(spec, spec.configs()[0])
    state = initial_state(h, 1)
    batch = h.program.batch(step_keys(1, 0)[0], 0)
    h = check_same_program(h, state.params, state.opt_state, batch)
    ours = h.fingerprint
    # A user's own jit of the same step, built here from the public pieces only.
    program = load_program("tied-embedding", **spec.configs()[0])
    user = jax.jit(program.step, donate_argnums=(0, 1)).lower(state.params, state.opt_state, batch).compile()
    assert fingerprint(user) == ours
    assert ours["alias_size_in_bytes"] > 0 and "may-alias" in ours["input_output_alias"]
    # Without donation (the frozen protocol) the program differs, and the fingerprint says so.
    frozen = fingerprint(plain_jit(program, ()).lower(state.params, state.opt_state, batch).compile())
    assert frozen["id"] != ours["id"] and frozen["alias_size_in_bytes"] == 0


class _Instrumented(TrainProgram):
    """A program whose jit() adds an op to the step: what the harness must refuse to measure."""

    def jit(self):
        def step(p, o, b):
            new_p, new_o, aux = self.step(p, o, b)
            return new_p, new_o, {**aux, "extra": sum(jax.numpy.sum(x) for x in jax.tree_util.tree_leaves(new_p))}

        return jax.jit(step, donate_argnums=self.donate_argnums)


@pytest.mark.slow
def test_a_different_compiled_step_is_refused():
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=1, **TINY)
    base = load_program("tied-embedding", **spec.configs()[0])
    h = prepare(spec, spec.configs()[0], program=_Instrumented(**{f: getattr(base, f) for f in (
        "name", "init", "batch", "step", "donate_argnums", "jit_kwargs", "options", "target_leaf")}))
    state = initial_state(h, 1)
    with pytest.raises(HarnessError, match="differs from a plain loop.s jax.jit"):
        h = check_same_program(h, state.params, state.opt_state, h.program.batch(step_keys(1, 0)[0], 0))
    assert replace(base, donate_argnums=()).donate_argnums == ()


USER_LOOP = '''
import sys
import jax
from xla_harness.programs.interface import load_program
prog = load_program("tied-embedding", mode="full", remat=True, **{TINY!r})
step = jax.jit(prog.step, donate_argnums=(0, 1))
p, o = prog.init(jax.random.key(1))
for i in range(2):
    key = jax.random.split(jax.random.fold_in(jax.random.key(1), i))[0]
    p, o, aux = step(p, o, prog.batch(key, i))
print(float(aux["loss"]))
'''


def _step_dump(folder: Path) -> tuple[set[str], set[str]]:
    """Distinct contents of the dumped optimized HLO and buffer assignment of jit_step."""
    hlo = {normalise_hlo_text(f.read_text()) for f in folder.glob("*jit_step*after_optimizations.txt")}
    ba = {f.read_text() for f in folder.glob("*jit_step*after_optimizations-buffer-assignment.txt")}
    return hlo, ba


@pytest.mark.slow
def test_xla_dump_of_the_harness_step_equals_a_plain_user_loop(tmp_path):
    """XLA's own dumps: the optimized HLO and buffer assignment of the step the harness runs are
    byte for byte those of a plain user loop (no checks, rollback or injection inside it)."""
    flags = "--xla_dump_hlo_as_text --xla_force_host_platform_device_count=8 --xla_dump_to="
    user = tmp_path / "user.py"
    user.write_text(USER_LOOP.replace("{TINY!r}", repr(TINY)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": flags + str(tmp_path / "dump_user")}
    res = subprocess.run([sys.executable, str(user)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    res = _cli("stress", "--out", str(tmp_path / "o"), "--modes", "full", "--remat", "on", "--seeds", "1",
               "--steps", "4", "--inject-rate", "0.5", "--quiet", *TINY_ARGS,
               env_extra={"XLA_FLAGS": flags + str(tmp_path / "dump_harness")})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step fingerprint full/remat=on/f32:" in res.stdout and "= plain jax.jit(step" in res.stdout
    user_hlo, user_ba = _step_dump(tmp_path / "dump_user")
    ours_hlo, ours_ba = _step_dump(tmp_path / "dump_harness")
    assert len(user_hlo) == len(user_ba) == 1
    assert ours_hlo == user_hlo  # every jit_step the harness compiled is the user's
    assert ours_ba == user_ba
    assert "scatter" in next(iter(user_hlo))


# ----------------------------------------------------------------------------- a foreign program


def test_foreign_program_counts_match_its_planted_rate(foreign, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["stress", "--program", f"{foreign}:make", "--program-option", "width=8", "--seeds", "1,2",
               "--steps", "60", "--block", "20", "--out", str(out), "--json", "--quiet"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    (row,) = data["configs"]
    assert row["config"] == f"{foreign}:make[width=8]"
    expected = {seed: _poisoned(foreign, seed, 60) for seed in (1, 2)}
    for seed in (1, 2):
        got = [s.step for b in results.read_results(out / "stress.jsonl").blocks if b.seed == seed
               for s in b.steps if not s.finite]
        assert got == expected[seed]  # exactly its own poisoned steps: rollback keeps events separate
    k = sum(len(v) for v in expected.values())
    assert row["nonfinite"] == k and row["steps"] == 120
    lo, hi = stats.clopper_pearson(k, 120, 0.99)
    assert lo <= 0.25 <= hi
    assert set(data["fingerprints"]) == {row["config"]}


def test_foreign_program_bad_specs_are_one_line_errors(foreign, tmp_path, capsys):
    for spec, needle in ((f"{foreign}:nope", "has no attribute 'nope'"),
                         (str(tmp_path / "missing.py") + ":make", "no such file"),
                         ("no_such_module_xyz:make", "cannot import no_such_module_xyz"),
                         ("tied", "not a built-in")):
        rc = main(["stress", "--program", spec, "--steps", "1", "--out", str(tmp_path / "x"), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    rc = main(["stress", "--program", f"{foreign}:make", "--program-option", "depth=3", "--steps", "1",
               "--out", str(tmp_path / "y"), "--quiet"])
    assert rc == 2 and "depth" in capsys.readouterr().err


def test_scan_model_scans_the_foreign_step(foreign, tmp_path, capsys):
    rc = main(["scan", "--model", "--program", f"{foreign}:make", "--json",
               "--save-hlo", str(tmp_path / "s.hlo")])
    assert rc == 0
    (mod,) = json.loads(capsys.readouterr().out)["modules"]
    assert mod["module"] == "jit_step"
    text = (tmp_path / "s.hlo").read_text()
    assert text.startswith("HloModule jit_step") and "tanh" in text


@pytest.mark.slow
def test_bundle_of_a_foreign_program_imports_its_source(foreign, tmp_path, capsys):
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", "--program", f"{foreign}:make", "--program-option", "width=8", "--out", str(out),
                 "--steps", "12", "--seeds", "1"]) == 0
    with tarfile.open(out) as tf:
        names = set(tf.getnames())
        config = json.loads(tf.extractfile("bundle/config.json").read())
        expected = json.loads(tf.extractfile("bundle/expected.json").read())
    assert "bundle/program/my_model.py" in names and config["program"] == "my_model.py:make"
    assert expected["seeds"]["1"]["nonfinite"] == len(_poisoned(foreign, 1, 12))
    capsys.readouterr()
    # The program is code from the archive: --check verifies, but runs it only when told to.
    assert main(["bundle", "--check", str(out)]) == 0
    text = capsys.readouterr().out
    assert "not re-run: the program in program/ is code from the archive" in text and "-> same" not in text
    assert main(["bundle", "--check", str(out), "--run-program"]) == 0
    assert "-> same" in capsys.readouterr().out


@pytest.mark.slow
def test_bisect_passes_takes_a_foreign_program(foreign, tmp_path, capsys):
    passes = "algsimp,cse,fusion"
    rc = main(["bisect-passes", "--program", f"{foreign}:make", "--program-option", "poison=0.0",
               "--oracle", "stress", "--inject-pass", "algsimp", "--inject-rate", "0.3", "--baseline-steps", "40",
               "--passes", passes, "--out", str(tmp_path / "b"), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "removes the failure: algsimp\n" in captured.out


PLUGIN_TEST = """
import pytest

def test_user_program(xla_harness_stress):
    xla_harness_stress(program_options={"width": 8})
"""


def test_pytest_fixture_runs_a_foreign_program(foreign, pytester):
    pytester.makepyfile(test_user=PLUGIN_TEST)
    res = pytester.runpytest_inprocess("--xla-harness-stress", "--xla-harness-steps", "12", "--xla-harness-seeds", "1",
                                       "--xla-harness-program", f"{foreign}:make")
    res.assert_outcomes(failed=1)  # its planted NaNs fail the test, with the table
    res.stdout.fnmatch_lines(["*non-finite step(s):*", "*my_model.py:make*"])


@pytest.mark.slow
def test_a_program_split_over_files_imports_its_sibling_from_any_working_directory(tmp_path):
    """A wrapper that imports its model from a sibling file (``from tiedlm import loss``), run from
    another folder: the program's folder is importable, as under ``python FILE.py``, both when the
    file is loaded and when its functions import lazily later. Planted: without the sibling, the
    same command is one error line naming the missing module, exit 2."""
    prog = tmp_path / "models"
    prog.mkdir()
    (prog / "tiedlm.py").write_text(FOREIGN_PROGRAM)
    (prog / "lazyhelper.py").write_text("SCALE = 1.0\n")
    (prog / "wrapper.py").write_text(
        "from tiedlm import make as _make\n\n"
        "def make():\n"
        "    import lazyhelper  # imported when make runs, after loading\n"
        "    assert lazyhelper.SCALE == 1.0\n"
        "    return _make()\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "xla_harness.cli", "stress", "--program", f"{prog}/wrapper.py:make",
            "--seeds", "1", "--steps", "3", "--quiet", "--out", str(tmp_path / "out")]
    ran = subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    (prog / "tiedlm.py").unlink()
    argv[-1] = str(tmp_path / "out2")
    missing = subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "tiedlm" in missing.stderr and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
