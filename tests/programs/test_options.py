"""#34 items 1, 4 and 8: what a run is configured with is what the user asked for, or refused.

1. Every option of every built-in program is declared once in its option table
   (xla_harness/programs/options.py) and checked by type and value: ``remat=off`` arrived as the text
   "off" and was read as True (the compile was the remat=True one), ``remat=maybe`` was accepted,
   ``layers=(1.5,2)`` truncated, ``mesh_shape=(-1,-1)`` taken on one device, ``embed_spec=model,``
   read as ``model,none``.
4. --devices with a program and a target is honoured (it compiled on all 8 chips), a
   --program-option devices= that disagrees with it is refused (it silently won), --compile-only
   --protocol frozen compiles the step as the frozen protocol runs it (no donation), and scan's
   program flags without --model are refused (ignored before).
8. Every numeric flag is a finite number in range, checked while the command line is read
   (--checkpoint-seconds nan was an ``error: internal:`` after the run had started).
"""

from __future__ import annotations

import inspect
import math

import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.programs import issue_35409, tied_embedding
from xla_harness.programs.interface import BUILTIN_OPTION_TABLES, check_program_options

from ..bad_input_cases import TINY_35409

SMALL = dict(scale=1 / 64, seq_scale=1 / 8, layers=(1, 2))
TABLES = [(issue_35409.make, issue_35409.OPTIONS), (tied_embedding.program, tied_embedding.OPTIONS)]

# (program factory, option, a value it must refuse): the issue's cases first.
REFUSED = [
    (issue_35409.make, "remat", "off"), (issue_35409.make, "remat", "maybe"), (issue_35409.make, "remat", 0),
    (issue_35409.make, "layers", (1.5, 2)), (issue_35409.make, "layers", (3, 2)), (issue_35409.make, "layers", [1]),
    (issue_35409.make, "mesh_shape", (-1, -1)), (issue_35409.make, "mesh_shape", (2,)),
    (issue_35409.make, "mesh_shape", (1.0, 1)), (issue_35409.make, "embed_spec", "model,"),
    (issue_35409.make, "embed_spec", "model"), (issue_35409.make, "embed_spec", 3),
    (issue_35409.make, "scale", 0), (issue_35409.make, "scale", True), (issue_35409.make, "scale", math.nan),
    (issue_35409.make, "seq_scale", 1.5), (issue_35409.make, "lr", -1), (issue_35409.make, "lr", math.inf),
    (issue_35409.make, "donate", "False"), (issue_35409.make, "donate", 1), (issue_35409.make, "jit", "bogus"),
    (issue_35409.make, "specs", "mine"), (issue_35409.make, "axis_types", "manual"),
    (issue_35409.make, "dtype", "f64"), (issue_35409.make, "mode", "tied"), (issue_35409.make, "variant", "nope"),
    (issue_35409.make, "devices", 0), (issue_35409.make, "devices", [1, 2]), (issue_35409.make, "devices", True),
    (tied_embedding.program, "remat", "off"), (tied_embedding.program, "vocab", 1.5),
    (tied_embedding.program, "vocab", True), (tied_embedding.program, "seq", 1),
    (tied_embedding.program, "learning_rate", "fast"), (tied_embedding.program, "devices", -2),
    (tied_embedding.program, "variant", "nope"), (tied_embedding.program, "mode", "tied"),
]


@pytest.mark.parametrize("factory,table", TABLES, ids=["issue-35409", "tied-embedding"])
def test_every_option_of_a_builtin_is_declared_once_with_its_check(factory, table):
    """The table and the factory name the same options (a new parameter without a line in the table, or
    a line without a parameter, fails here), and the factory is the table's checked one."""
    params = [p for p in inspect.signature(factory).parameters]
    assert list(table.names) == params
    assert factory.options is table
    assert BUILTIN_OPTION_TABLES["issue-35409"].endswith(":OPTIONS")


@pytest.mark.parametrize("factory,key,value", REFUSED,
                         ids=[f"{f.__module__.rsplit('.', 1)[-1]}-{k}-{v!r}" for f, k, v in REFUSED])
def test_a_value_of_the_wrong_type_or_range_is_refused_naming_the_option(factory, key, value):
    with pytest.raises(HarnessError) as got:
        factory(**{key: value})
    assert f"option {key} must be" in str(got.value) and "\n" not in str(got.value)


def test_an_unknown_option_is_refused_naming_what_the_program_takes():
    with pytest.raises(HarnessError, match="unknown option 'frobnicate'; it takes scale, mode"):
        issue_35409.make(frobnicate=1)
    with pytest.raises(HarnessError, match="unknown option 'width'"):
        tied_embedding.program(width=3)


def test_what_passes_is_what_the_program_uses():
    """Values are normalized, never coerced from another meaning: a list pair is the pair, an explicit
    'none' axis is a whole dimension; bools stay bools."""
    assert issue_35409.OPTIONS.validate({"layers": [1, 2], "mesh_shape": [1, 1], "embed_spec": "model,none",
                                         "remat": False}) == {"layers": (1, 2), "mesh_shape": (1, 1),
                                                              "embed_spec": ("model", None), "remat": False}
    program = issue_35409.make(**SMALL, remat=False, embed_spec="none,none")
    assert program.options["remat"] is False and program.options["embed_spec"] == "none,none"


@pytest.mark.slow
def test_remat_off_was_the_remat_on_program_now_it_is_refused_and_false_is_honoured():
    """The issue's case: the text "off" compiled the remat=True step. Refused now; False and True give
    different steps (jax.checkpoint's rematerialized forward is in one only)."""
    import jax

    with pytest.raises(HarnessError, match="option remat must be True or False, got 'off'"):
        issue_35409.make(**SMALL, remat="off")

    def lowered(remat):
        p = issue_35409.make(**SMALL, remat=remat)
        params, opt = jax.eval_shape(p.init, jax.random.key(0))
        batch = jax.eval_shape(p.batch, jax.random.key(0), 0)
        return jax.jit(p.step).lower(params, opt, batch).as_text()

    assert lowered(False) != lowered(True)


def test_the_command_line_refuses_a_bad_option_before_anything_compiles(monkeypatch, capsys):
    """Checked against the table while the command starts: no compile, no folder."""
    from xla_harness.stress import runner

    def planted(*a, **k):
        raise AssertionError("compiled despite a refused option")

    monkeypatch.setattr(runner, "compile_train_step", planted)
    assert main(["scan", "--model", "issue-35409", *TINY_35409, "--program-option", "remat=off"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: --program issue-35409: option remat must be True or False, got 'off'"]
    assert check_program_options("issue-35409", {"remat": True}) == {"remat": True}
    assert check_program_options("my.py:make", {"remat": "off"}) == {"remat": "off"}  # a user's: its own factory


def test_an_option_given_twice_with_two_values_is_refused(capsys):
    assert main(["scan", "--model", "issue-35409", "--program-option", "remat=True", "--program-option",
                 "remat=False"]) == 2
    assert "given twice" in capsys.readouterr().err


# ----------------------------------------------------------------------------- item 4: flags


@pytest.mark.parametrize("argv", [
    ["stress", "--quiet", "--out", "OUT", "--program", "issue-35409", "--devices", "2", "--program-option",
     "devices=4"],
    ["stress", "--compile-only", "--quiet", "--program", "issue-35409", "--devices", "2", "--program-option",
     "devices=4"],
    ["scan", "--model", "issue-35409", "--devices", "2", "--program-option", "devices=4"],
], ids=["stress", "compile-only", "scan"])
def test_devices_and_a_program_option_devices_that_disagree_are_refused(argv, tmp_path, capsys):
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--devices 2 and --program-option devices=4 disagree" in err
    assert not (tmp_path / "o").exists()


def test_with_devices_gives_the_count_to_the_program():
    from xla_harness.commands.flags import with_devices

    assert with_devices({"remat": True}, 2) == {"remat": True, "devices": 2}
    assert with_devices({"devices": 2}, 2) == {"devices": 2}
    assert with_devices({"devices": 4}, None) == {"devices": 4}
    with pytest.raises(HarnessError, match="disagree"):
        with_devices({"devices": 4}, 2)


@pytest.mark.parametrize("flag", [["--devices", "2"], ["--program-option", "remat=False"]])
def test_scan_refuses_program_flags_without_model(flag, tmp_path, capsys):
    (tmp_path / "m.hlo").write_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n")
    assert main(["scan", str(tmp_path / "m.hlo"), *flag]) == 2
    assert f"error: {flag[0]} needs --model" in capsys.readouterr().err


@pytest.mark.slow
def test_compile_only_devices_reaches_a_program_that_takes_it(tmp_path, capsys):
    """--devices 2 on the #35409 program: it compiled for its own default (one device on the host, all
    of a target's) before; the record now says 2."""
    import json

    assert main(["stress", "--compile-only", "--quiet", "--json", "--program", "issue-35409", *TINY_35409,
                 "--devices", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["devices"] for c in doc["configurations"]] == [2]
    assert doc["configurations"][0]["options"]["devices"] == 2


@pytest.mark.slow
def test_compile_only_devices_on_a_tpu_target(capsys):
    import json

    from xla_harness.targets import parse_target
    from xla_harness.targets.devices import missing

    why = missing(parse_target("tpu:v6e:2x4"))
    if why:
        pytest.skip(why)
    assert main(["stress", "--compile-only", "--quiet", "--json", "--target", "tpu:v6e:2x4", "--program",
                 "issue-35409", *TINY_35409, "--devices", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["devices"] for c in doc["configurations"]] == [2]  # all 8 chips before


@pytest.mark.slow
def test_scan_model_devices_reaches_the_program_on_a_target(tmp_path, capsys):
    """scan --model the same: --devices 2 on tpu:v6e:2x4 compiles the #35409 program for 2 chips."""
    from xla_harness.targets import parse_target
    from xla_harness.targets.devices import missing

    why = missing(parse_target("tpu:v6e:2x4"))
    if why:
        pytest.skip(why)
    saved = tmp_path / "m.hlo"
    assert main(["scan", "--model", "issue-35409", *TINY_35409, "--target", "tpu:v6e:2x4", "--devices", "2",
                 "--save-hlo", str(saved)]) in (0, 1)
    header = saved.read_text().split("\n", 1)[0]
    assert "num_partitions=2" in header, header


@pytest.mark.slow
def test_compile_only_frozen_compiles_the_step_without_donation(tmp_path):
    """The frozen protocol calls the step on the same inputs every time, so it donates nothing; the
    compile-only record of a frozen matrix is that step (it was the donated train step)."""
    from xla_harness.stress.compile_only import compile_matrix
    from xla_harness.stress.spec import StressSpec
    from xla_harness.targets import HOST

    small = dict(vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8, modes=("full",), remats=(True,))
    [frozen] = list(compile_matrix(StressSpec(protocol="frozen", **small), HOST))
    [train] = list(compile_matrix(StressSpec(protocol="train", **small), HOST))
    assert frozen.record["fingerprint"]["donate_argnums"] == [] and frozen.record["protocol"] == "frozen"
    assert train.record["fingerprint"]["donate_argnums"] == [0, 1]
    assert frozen.record["fingerprint"]["alias_size_in_bytes"] < train.record["fingerprint"]["alias_size_in_bytes"]


# ----------------------------------------------------------------------------- item 8: numbers


@pytest.mark.parametrize("argv,flag", [
    (["stress", "--checkpoint-seconds", "nan"], "--checkpoint-seconds"),
    (["stress", "--checkpoint-seconds", "inf"], "--checkpoint-seconds"),
    (["stress", "--checkpoint-seconds", "-1"], "--checkpoint-seconds"),
    (["stress", "--stop-grace", "nan"], "--stop-grace"), (["stress", "--stop-grace", "inf"], "--stop-grace"),
    (["stress", "--lr", "nan"], "--lr"), (["stress", "--lr", "1e400"], "--lr"), (["stress", "--lr", "0"], "--lr"),
    (["stress", "--steps", "0"], "--steps"), (["stress", "--seeds", "1,-2"], "--seeds"),
    (["stress", "--seeds", str(2**31)], "--seeds"), (["stress", "--process-id", "-1"], "--process-id"),
    (["bundle", "--check", "x.tar.gz", "--timeout", "nan"], "--timeout"),
    (["bundle", "--check", "x.tar.gz", "--timeout", "inf"], "--timeout"),
    (["bundle", "--check", "x.tar.gz", "--timeout", "0"], "--timeout"),
    (["bundle", "--check", "x.tar.gz", "--max-steps", "-1"], "--max-steps"),
    (["bundle", "--out", "o.tar.gz", "--seeds", "-1"], "--seeds"),
    (["compare", "a", "b", "--alpha", "nan"], "--alpha"), (["compare", "a", "b", "--alpha", "1"], "--alpha"),
    (["bisect-passes", "--inject-rate", "inf"], "--inject-rate"), (["bisect-passes", "--seed", "-1"], "--seed"),
    (["bisect-passes", "--baseline-steps", "0"], "--baseline-steps"),
])
def test_numeric_flags_are_checked_while_the_command_line_is_read(argv, flag, monkeypatch, capsys, tmp_path):
    """One line naming the flag, from the parser: the command itself never starts."""
    import importlib

    module = {"stress": "stress", "bundle": "bundle", "compare": "compare", "bisect-passes": "bisect_passes"}[argv[0]]
    monkeypatch.setattr(importlib.import_module(f"xla_harness.commands.{module}"), "run",
                        lambda args: pytest.fail("the command ran"))
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: xla-harness {argv[0]}: argument {flag}")


def test_a_spec_refuses_a_checkpoint_interval_that_is_no_number():
    from xla_harness.stress.spec import StressSpec

    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(HarnessError, match="checkpoint-seconds"):
            StressSpec(checkpoint_seconds=bad)
