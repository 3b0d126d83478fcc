"""#34 item 1: what a run is configured with is what the user asked for, or refused.

Every option of every built-in program is declared once in its option table
(xla_harness/programs/options.py) and checked by type and value: ``remat=off`` arrived as the text
"off" and was read as True (the compile was the remat=True one), ``remat=maybe`` was accepted,
``layers=(1.5,2)`` truncated, ``mesh_shape=(-1,-1)`` taken on one device, ``embed_spec=model,``
read as ``model,none``. (--devices and the numeric flags: tests/cli/test_flags_checked.py.)
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
