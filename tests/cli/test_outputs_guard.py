"""Never lose a result, never run what the user did not ask for: outputs never replace an input or
a results file (an other existing file only with --force), and whatever the user's program raises
while it is imported, built or traced is one ``error:`` line (an interrupt stays an interrupt)."""

import pytest

from xla_harness.cli import main
from xla_harness.upstream.series import PATCHES_DIR

from ..bad_input_cases import GOOD
from ..helpers import FOREIGN_PROGRAM


def _err(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def _one_error(capsys, *needles) -> str:
    err = _err(capsys)
    assert len(err) == 1 and err[0].startswith("error:"), err
    for n in needles:
        assert n in err[0], err
    return err[0]


@pytest.fixture
def results(tmp_path):
    d = tmp_path / "D"
    d.mkdir()
    (d / "stress.jsonl").write_bytes(GOOD)
    return d


# ----------------------------------------------------------------------------- report / merge --plot


@pytest.mark.parametrize("command", ["report", "merge"])
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_plot_never_replaces_its_input(results, capsys, command, force):
    rc = main([command, str(results), "--plot", str(results / "stress.jsonl"), *force])
    assert rc == 2
    _one_error(capsys, "--plot", "inputs")
    assert (results / "stress.jsonl").read_bytes() == GOOD


def test_plot_never_replaces_an_input_through_another_spelling(results, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    link = tmp_path / "alias.jsonl"
    link.symlink_to(results / "stress.jsonl")
    assert main(["report", "D", "--plot", "alias.jsonl", "--force"]) == 2
    _one_error(capsys, "inputs")
    assert main(["report", "D", "--plot", "./D/../D/stress.jsonl", "--force"]) == 2
    _one_error(capsys, "inputs")
    assert (results / "stress.jsonl").read_bytes() == GOOD


def test_plot_never_replaces_another_results_file(results, capsys, tmp_path):
    other = tmp_path / "E"
    other.mkdir()
    (other / "stress.jsonl").write_bytes(GOOD)
    assert main(["report", str(results), "--plot", str(other / "stress.jsonl"), "--force"]) == 2
    _one_error(capsys, "results file")
    assert (other / "stress.jsonl").read_bytes() == GOOD


def test_plot_onto_an_existing_file_needs_force(results, capsys, tmp_path):
    png = tmp_path / "old.png"
    png.write_bytes(b"keep me")
    assert main(["report", str(results), "--plot", str(png)]) == 2
    _one_error(capsys, "already exists", "--force")
    assert png.read_bytes() == b"keep me"
    assert main(["report", str(results), "--plot", str(png), "--force"]) == 0
    capsys.readouterr()
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_to_a_new_file(results, capsys, tmp_path):
    assert main(["report", str(results), "--plot", str(tmp_path / "new.png")]) == 0
    assert (tmp_path / "new.png").read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------------------- scan --save-hlo


def test_save_hlo_needs_model(tmp_path, capsys):
    hlo = tmp_path / "m.hlo"
    hlo.write_text("HloModule m\n")
    assert main(["scan", str(hlo), "--save-hlo", str(tmp_path / "out.hlo")]) == 2
    _one_error(capsys, "--save-hlo needs --model")
    assert not (tmp_path / "out.hlo").exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_save_hlo_never_replaces_results(results, capsys, force):
    assert main(["scan", "--model", "--save-hlo", str(results / "stress.jsonl"), *force]) == 2
    _one_error(capsys, "--save-hlo", "results file")
    assert (results / "stress.jsonl").read_bytes() == GOOD


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_save_hlo_never_replaces_a_scanned_file(tmp_path, capsys, force):
    hlo = tmp_path / "dump" / "m.txt"
    hlo.parent.mkdir()
    hlo.write_text("HloModule m\n")
    assert main(["scan", str(hlo.parent), "--model", "--save-hlo", str(hlo), *force]) == 2
    _one_error(capsys, "inputs")
    assert hlo.read_text() == "HloModule m\n"


def test_save_hlo_never_replaces_the_program_file(tmp_path, capsys):
    prog = tmp_path / "my_model.py"
    prog.write_text(FOREIGN_PROGRAM)
    assert main(["scan", "--model", f"{prog}:make", "--save-hlo", str(prog), "--force"]) == 2
    _one_error(capsys, "inputs")
    assert prog.read_text() == FOREIGN_PROGRAM


def test_save_hlo_onto_an_existing_file_needs_force(tmp_path, capsys):
    old = tmp_path / "old.hlo"
    old.write_text("keep me")
    assert main(["scan", "--model", "--save-hlo", str(old)]) == 2
    _one_error(capsys, "already exists", "--force")
    assert old.read_text() == "keep me"


# ----------------------------------------------------------------------------- pr --out


def test_pr_out_never_replaces_files_without_force(tmp_path, capsys):
    out = tmp_path / "pr"
    out.mkdir()
    (out / "PR.md").write_text("my notes")
    assert main(["pr", "--target", "xla", "--out", str(out)]) == 2
    _one_error(capsys, "PR.md", "already exists", "--force")
    assert (out / "PR.md").read_text() == "my notes"
    assert not (out / "series.mbox").exists()  # all or nothing
    assert main(["pr", "--target", "xla", "--out", str(out), "--force"]) == 0
    capsys.readouterr()
    assert (out / "PR.md").read_text() != "my notes"
    assert main(["pr", "--target", "xla", "--out", str(out)]) == 2  # its own bundle too
    _one_error(capsys, "already exists")


def test_pr_out_never_replaces_its_inputs(tmp_path, capsys):
    series = PATCHES_DIR / "series.toml"
    before = series.read_bytes()
    out = tmp_path / "pr"
    out.mkdir()
    (out / "PR.md").symlink_to(series)
    assert main(["pr", "--target", "xla", "--out", str(out), "--force"]) == 2
    _one_error(capsys, "PR.md", "inputs")
    assert series.read_bytes() == before


# ----------------------------------------------------------------------------- the user's program


def _program(tmp_path, body: str) -> str:
    path = tmp_path / "user_prog.py"
    path.write_text(body)
    return str(path)


def _stress(tmp_path, program: str) -> int:
    return main(["stress", "--program", program, "--steps", "1", "--seeds", "0", "--out", str(tmp_path / "o"),
                 "--quiet"])


def test_program_exiting_at_import(tmp_path, capsys):
    prog = _program(tmp_path, "raise SystemExit(0)\n")
    assert _stress(tmp_path, f"{prog}:make") == 2
    _one_error(capsys, prog, "SystemExit(0)")


def test_program_builtins_exit(tmp_path, capsys):
    assert _stress(tmp_path, "builtins:exit") == 2
    _one_error(capsys, "--program builtins:exit", "SystemExit")


def test_program_raising_a_base_exception(tmp_path, capsys):
    prog = _program(tmp_path, "class Boom(BaseException):\n    pass\n\n\ndef make():\n    raise Boom('bang')\n")
    assert _stress(tmp_path, f"{prog}:make") == 2
    _one_error(capsys, "Boom: bang")


def test_program_interrupted_at_import_is_an_interrupt(tmp_path, capsys):
    prog = _program(tmp_path, "raise KeyboardInterrupt\n")
    assert _stress(tmp_path, f"{prog}:make") == 130
    assert "interrupted" in capsys.readouterr().err


BAD_STEP = '''
import jax.numpy as jnp

from xla_harness.programs.interface import TrainProgram


def init(key):
    return {"w": jnp.ones((4,))}, {"m": jnp.zeros((4,))}


def batch(key, step):
    return jnp.ones((4,))


def two(params, opt_state, b):
    return params, opt_state


def no_loss(params, opt_state, b):
    return params, opt_state, {"l": jnp.sum(params["w"] * b)}


def vector_loss(params, opt_state, b):
    return params, opt_state, {"loss": params["w"] * b}


def renamed(params, opt_state, b):
    return {"v": params["w"]}, opt_state, {"loss": jnp.sum(params["w"] * b)}


def exits(params, opt_state, b):
    raise SystemExit(3)


def to_bf16(params, opt_state, b):
    return {"w": params["w"].astype(jnp.bfloat16)}, opt_state, {"loss": jnp.sum(params["w"] * b)}


def reshaped(params, opt_state, b):
    return params, {"m": opt_state["m"].reshape(2, 2)}, {"loss": jnp.sum(params["w"] * b)}


def make(kind="two"):
    return TrainProgram(name="bad", init=init, batch=batch, step=globals()[kind])


def bad_init():
    return TrainProgram(name="bad", init=lambda key: {"w": jnp.ones((4,))}, batch=batch, step=two)
'''


@pytest.mark.parametrize("kind, needle", [
    ("two", "step returned a 2-tuple; expected (params, opt_state, aux)"),
    ("no_loss", "without 'loss'"),
    ("vector_loss", "of shape (4,); expected a scalar"),
    ("exits", "step raised SystemExit(3)"),
    ("renamed", "returned params whose structure differs"),
    ("to_bf16", "changed params['w'] from float32[4] to bfloat16[4]"),
    ("reshaped", "changed opt_state['m'] from float32[4] to float32[2, 2]"),
])
def test_step_outputs_are_checked(tmp_path, capsys, kind, needle):
    prog = _program(tmp_path, BAD_STEP)
    rc = main(["stress", "--program", f"{prog}:make", "--program-option", f"kind={kind!r}", "--steps", "1",
               "--seeds", "0", "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 2
    _one_error(capsys, f"--program {prog}:make", needle)


def test_step_outputs_are_checked_before_scan_compiles(tmp_path, capsys):
    prog = _program(tmp_path, BAD_STEP)
    assert main(["scan", "--model", f"{prog}:make"]) == 2
    _one_error(capsys, "step returned a 2-tuple")


def test_init_outputs_are_checked(tmp_path, capsys):
    prog = _program(tmp_path, BAD_STEP)
    assert _stress(tmp_path, f"{prog}:bad_init") == 2
    _one_error(capsys, "init returned dict; expected (params, opt_state)")
