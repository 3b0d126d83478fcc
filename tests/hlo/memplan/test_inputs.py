"""A dump whose files do not belong together, are cut or malformed gets one ``error:`` line naming the
file and line, exit 2: never "0 conflicts", never a list of false races. Each case is a dump of this
test's own making from real ones."""

from __future__ import annotations

import gzip
import os
import re
import shutil
from pathlib import Path

import pytest

from xla_harness.cli import main

ROOT = Path(__file__).resolve().parents[3]
SMALL = ROOT / "results/gpu/h100-2026-11-28/memory-plan/dump"
STEM = "module_0000.jit_stage.sm_9.0a_gpu_after_optimizations"
CUDA = ROOT / "results/cuda-aot/live-range"


def _dump(tmp: Path, module: Path, ba: Path, lr: Path | None = None) -> Path:
    """``module`` with ``ba`` (and ``lr``) beside it, named as one dump's files."""
    shutil.copy(module, tmp / "m.txt.gz")
    shutil.copy(ba, tmp / "m-buffer-assignment.txt.gz")
    if lr is not None:
        shutil.copy(lr, tmp / "m-live-range.txt.gz")
    return tmp / "m.txt.gz"


def _small(tmp: Path, edit=None, lr: bool = True) -> Path:
    """The small real XLA:GPU dump (copy.1 of the parameter), its buffer assignment edited by ``edit``."""
    m = _dump(tmp, SMALL / f"{STEM}.txt.gz", SMALL / f"{STEM}-buffer-assignment.txt.gz",
              SMALL / f"{STEM}-live-range.txt.gz" if lr else None)
    if edit is not None:
        ba = tmp / "m-buffer-assignment.txt.gz"
        ba.write_bytes(gzip.compress(edit(gzip.decompress(ba.read_bytes()).decode()).encode()))
    return m


def _refused(capsys, path: Path) -> str:
    rc = main(["memcheck", str(path)])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "conflicts" not in out, (rc, out, err)
    assert "Traceback" not in err
    return errors[0]


def test_the_small_dump_is_checked_whole(tmp_path, capsys):
    assert main(["memcheck", str(_small(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 values checked" in out and "0 conflicts" in out


@pytest.mark.parametrize("edit,said", [
    (lambda t: t[:-1], "m-buffer-assignment.txt.gz:5: the file ends mid-line: cut short"),
    (lambda t: t[:t.rindex("offset=") + 4], "m-buffer-assignment.txt.gz:5: the file ends mid-line: cut short"),
    (lambda t: t.replace("(size=4,offset=0): s32[]\nallocation 1", "(size=-4,offset=0): s32[]\nallocation 1"),
     "m-buffer-assignment.txt.gz:3: a negative size"),
    (lambda t: t.replace("<1 copy.1", "<0 copy.1"), "m-buffer-assignment.txt.gz:5: value id 0 is also the value of "
                                                     "line 3"),
    (lambda t: t.replace("<1 copy.1 @0> (size=4,offset=0)", "<1 copy.1 @0> (size=4,offset=2)"),
     "m-buffer-assignment.txt.gz:3: bytes [2, 6) run past the end of allocation of size 4 (line 2)"),
    (lambda t: t.replace(" value: <1 copy.1", " valeu: <1 copy.1"), "m-buffer-assignment.txt.gz:3: not a value line"),
    (lambda t: t.replace("copy.1 @0> (size=4,offset=0): s32[]", "copy.1 @0> (size=8,offset=0): s32[2]")
     .replace("size 4, page 0, output", "size 8, page 0, output"),
     "m-buffer-assignment.txt.gz:3: copy.1 is s32[2] here and s32[]"),
    (lambda t: t.replace("copy.1", "copy.7"), "m-buffer-assignment.txt.gz:3: copy.7 is no instruction of the module"),
    (lambda t: t.replace("parameter 0, shape |s32[]|", "parameter 3, shape |s32[]|"),
     "allocation 1 holds entry parameter 3, which the module does not have"),
    (lambda t: t.replace("at ShapeIndex {}:", "at ShapeIndex {}, maybe-live-out:"),
     "allocation 1 of parameter 0 is live out, but the module neither donates parameter 0 nor returns it"),
])
def test_a_malformed_or_foreign_buffer_assignment_is_refused_by_line(tmp_path, capsys, edit, said):
    assert said in _refused(capsys, _small(tmp_path, edit))


def test_another_modules_buffer_assignment_is_refused(tmp_path, capsys):
    """The small module with the #35409 compile's buffer assignment (files named alike are easy to mix):
    before, "28/400 values timed, 0 conflicts", exit 0."""
    cuda = next(CUDA.glob("*.after_optimizations.txt.gz"))
    m = _dump(tmp_path, SMALL / f"{STEM}.txt.gz", Path(str(cuda).replace(".txt.gz", "-buffer-assignment.txt.gz")))
    assert "is no instruction of the module: the buffer assignment and the module are not one compile's" in \
        _refused(capsys, m)


def test_another_modules_live_range_is_refused(tmp_path, capsys):
    cuda = next(CUDA.glob("*.after_optimizations.txt.gz"))
    m = _dump(tmp_path, SMALL / f"{STEM}.txt.gz", SMALL / f"{STEM}-buffer-assignment.txt.gz",
              Path(str(cuda).replace(".txt.gz", "-live-range.txt.gz")))
    assert "m-live-range.txt.gz (live range): its instruction sequence is not the module's schedule" in \
        _refused(capsys, m)


def _step(x, y):
    import jax.numpy as jnp

    return jnp.sin(x) * 2 + y, jnp.tanh(y) @ x.T


def test_a_module_that_donates_with_a_buffer_assignment_that_does_not(tmp_path, capsys):
    """The module says its parameter is donated (input_output_alias), the buffer assignment keeps the
    parameter apart (not live out): another compile's, as a sibling with the other donation is."""
    m = _small(tmp_path)
    text = gzip.decompress(m.read_bytes()).decode()
    m.write_bytes(gzip.compress(text.replace("HloModule jit_stage, is_scheduled=true,", "HloModule jit_stage, "
                                             "is_scheduled=true, input_output_alias={ {}: (0, {}, may-alias) },",
                                             1).encode()))
    assert "the module donates parameter 0 (input_output_alias), but allocation 1 holding it is not live out" in \
        _refused(capsys, m)


def _step(x, y):
    import jax.numpy as jnp

    return jnp.sin(x) * 2 + y, jnp.tanh(y) @ x.T


@pytest.mark.parametrize("module_donates", [True, False])
def test_the_sibling_compile_with_the_other_donation_is_refused(tmp_path, capsys, module_donates):
    """The same program compiled with and without donating x, each module with the other's buffer
    assignment: refused as not one compile's (here the names already differ; where they do not, the
    donation does: the test above). Before: thousands of false conflicts on a TPU pair (exit 1)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((8, 16))
    for donate, name in (((0,), "donated"), ((), "kept")):
        jax.jit(_step, donate_argnums=donate).lower(x, x).compile(
            compiler_options={"xla_dump_to": str(tmp_path / name), "xla_dump_hlo_as_text": True})
    pick = {n: next((tmp_path / n).glob("*jit__step*after_optimizations.txt")) for n in ("donated", "kept")}
    for own in pick.values():
        assert main(["memcheck", str(own)]) == 0
    capsys.readouterr()
    mod, ba = (pick["donated"], pick["kept"]) if module_donates else (pick["kept"], pick["donated"])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(mod, mixed / "m.txt")
    shutil.copy(str(ba).replace(".txt", "-buffer-assignment.txt"), mixed / "m-buffer-assignment.txt")
    said = _refused(capsys, mixed / "m.txt")
    assert "not one compile's" in said or "donat" in said, said


def test_a_device_or_a_fifo_is_not_a_dump(tmp_path, capsys):
    assert _refused(capsys, Path("/dev/zero")) == ("error: /dev/zero: not a regular file or a folder (a device, a "
                                                   "FIFO): give a dump folder or a module file")
    os.mkfifo(tmp_path / "f")
    assert "not a regular file or a folder" in _refused(capsys, tmp_path / "f")


def test_scan_says_a_plan_it_could_not_check(tmp_path, capsys):
    m = _small(tmp_path, lambda t: t.replace("copy.1", "copy.7"), lr=False)
    plain = tmp_path / "scan"
    plain.mkdir()
    (plain / f"{STEM}.txt").write_bytes(gzip.decompress(m.read_bytes()))
    (plain / f"{STEM}-buffer-assignment.txt").write_bytes(
        gzip.decompress((tmp_path / "m-buffer-assignment.txt.gz").read_bytes()))
    assert main(["scan", str(plain)]) == 2
    out, err = capsys.readouterr()
    assert "memory plan: not checked" in out and re.search(r"error: memory plan not checked: .*:3: copy.7 is no "
                                                           "instruction of the module", err)
