"""Whose NaN it is, through the library (:func:`xla_harness.origin.classify.origin_of`), on programs
planted with each cause (tests/origin/programs): each class decided by what it rests on, the line
named the user's own (in the sibling module where the loss lives), and each step that decides a class
shown to matter: without the replays a race reads as the compiler's, with float32 in place of float64
an overflow reads as the program's, with jax's frames the line is not the user's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_harness.origin import classify
from xla_harness.origin.births import Site, SourceLine
from xla_harness.origin.classify import Origin, Replayed, origin_of
from xla_harness.origin.eager import host
from xla_harness.origin.source import locate
from xla_harness.programs.interface import load_program

PROGRAMS = Path(__file__).resolve().parent / "programs"
WHOSE = f"{PROGRAMS / 'whose.py'}:make"
ORACLE = f"{Path(__file__).resolve().parents[1] / 'oracle_program.py'}:make"
FAIL = 3


def planted_line(file: str, kind: str) -> int:
    lines = (PROGRAMS / file).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# plant: {kind}"))


def compiled_replay(program, params, opt_state, batch):
    compiled = jax.jit(program.step).lower(params, opt_state, batch).compile()

    def replay() -> Replayed:
        out = compiled(params, opt_state, batch)
        leaves = [host(x) for x in jax.tree_util.tree_leaves(out)]
        checked = classify.checked_outputs(out)
        finite = all(np.isfinite(a).all() for a, c in zip(leaves, checked, strict=True)
                     if c and np.issubdtype(a.dtype, np.inexact))
        return Replayed(bool(finite), tuple(hashlib.sha1(a.tobytes()).hexdigest() for a in leaves))

    return replay


def failing(spec: str, step: int = FAIL, **options):
    program = load_program(spec, **options)
    params, opt_state = program.init(jax.random.key(1))
    batch = program.batch(jax.random.key(100 + step), step)
    return program, (params, opt_state), batch


def explain(spec: str = WHOSE, step: int = FAIL, replays: int = 8, **options) -> Origin:
    program, state, batch = failing(spec, step, **options)
    replay = compiled_replay(program, *state, batch)
    return origin_of(program.step, state, batch, replay, replays=replays, user_folders=[str(PROGRAMS)])


def test_a_nan_in_the_batch_is_input_with_its_leaf_and_index():
    o = explain(kind="batch-nan")
    assert o.cls == "input" and o.where is None
    assert o.evidence["leaves"][0]["leaf"] == "batch['x']" and o.evidence["leaves"][0]["index"] == [2, 1]
    assert "batch['x'][2, 1] is NaN" in o.summary


def test_a_nan_in_init_is_input_from_the_state():
    o = explain(kind="init-nan", step=0)
    assert o.cls == "input" and o.evidence["leaves"][0]["leaf"] == "params['b']"
    assert o.evidence["leaves"][0]["index"] == [1]


@pytest.mark.parametrize("kind,file,primitive,known", [
    ("zero-over-zero", "whose_losses.py", "div", "zero-over-zero"),
    ("log-zero", "whose_losses.py", "log", "log-of-zero"),
    ("zero-over-zero-inline", "whose.py", "div", "zero-over-zero"),
])
def test_the_programs_own_math_names_the_users_line(kind, file, primitive, known):
    o = explain(kind=kind)
    assert o.cls == "program"
    assert o.evidence["replays"] == 8 and o.evidence["nonfinite"] == 8
    assert (o.where["file"], o.where["line"]) == (str(PROGRAMS / file), planted_line(file, kind))
    assert o.where["primitive"] == primitive and o.evidence["known_class"] == known
    assert o.evidence["eager_float64"] == "non-finite"


def test_a_where_gradient_trap_names_the_branch_and_the_where():
    o = explain(kind="where-trap")
    assert o.cls == "program" and o.evidence["known_class"] == "where-gradient-trap"
    assert o.where["line"] == planted_line("whose_losses.py", "where-trap-branch")  # the sqrt's derivative
    assert o.evidence["where_select"]["line"] == planted_line("whose_losses.py", "where-trap")
    assert o.evidence["nan_at"]["primitive"] == "mul"  # zero cotangent times an infinite derivative


def test_adam_with_eps_zero_names_optax_and_the_line_that_called_it():
    o = explain(kind="adam-eps0", step=0)
    assert o.cls == "program" and o.evidence["known_class"] == "adaptive-optimizer-eps-0"
    assert "optax" in o.where["library"]["file"]
    assert o.where["file"].endswith("xla_harness/programs/interface.py")  # step_from_loss called optax


def test_float32_overflow_that_float64_survives_is_precision():
    o = explain(kind="overflow")
    assert o.cls == "precision" and o.where["primitive"] == "exp"
    assert o.where["line"] == planted_line("whose_losses.py", "overflow")
    value = o.evidence["float64_at_first"]["value"]
    assert isinstance(value, float) and float(np.finfo(np.float32).max) < value < float(np.finfo(np.float64).max)


def test_precision_needs_float64_mutant_float32_reads_it_as_program(monkeypatch):
    monkeypatch.setattr(classify, "eager_float64", classify.eager_float32)  # the mutant: no float64
    assert explain(kind="overflow").cls == "program"


def test_a_fault_only_in_the_compiled_program_is_the_compilers():
    o = explain(f"{PROGRAMS / 'compiled_fault.py'}:make", step=0)
    assert o.cls == "compiler" and o.where is None
    assert o.evidence["eager_float32"] == "finite" and o.evidence["nonfinite"] == o.evidence["replays"] == 8


def test_a_nan_drawn_per_execution_is_a_race_and_only_the_replays_show_it():
    program = load_program(ORACLE, nan_execs=(0,))  # the measured execution (the first) draws the NaN
    params, opt_state = program.init(jax.random.key(1))
    batch = program.batch(jax.random.key(7), 0)
    compiled = jax.jit(program.step).lower(params, opt_state, batch).compile()
    out = compiled(params, opt_state, batch)
    assert not np.isfinite(np.asarray(out[2]["loss"]))  # the measurement: non-finite
    replay = compiled_replay(program, params, opt_state, batch)
    o = origin_of(program.step, (params, opt_state), batch, replay)
    assert o.cls == "race" and o.evidence["nonfinite"] == 0 and o.evidence["replays"] == 8
    skipped = origin_of(program.step, (params, opt_state), batch, replay, replays=0)  # the mutant: no replay
    assert skipped.cls != "race"


def test_replays_non_finite_in_other_places_are_a_race_even_when_all_fail():
    program, state, batch = failing(WHOSE, kind="zero-over-zero")
    runs = iter(range(100))

    def replay():
        i = next(runs)
        return Replayed(False, (str(i % 2),), nonfinite=f"mask {i % 2}")

    assert origin_of(program.step, state, batch, replay).cls == "race"


def test_replays_that_differ_only_in_finite_bits_do_not_make_a_deterministic_nan_a_race():
    """A GPU's atomic scatter-add changes the finite bits from replay to replay; a NaN in the same
    places every time is still decided by the op-by-op evaluation."""
    program, state, batch = failing(WHOSE, kind="zero-over-zero")
    runs = iter(range(100))

    def replay():
        return Replayed(False, (str(next(runs)),), ("['w']",), nonfinite="the same places")

    o = origin_of(program.step, state, batch, replay)
    assert o.cls == "program" and o.evidence["finite_bits_differ"] == ["['w']"]
    assert "non-finite in the same places" in o.summary


def test_without_a_replay_a_finite_eager_step_is_unknown_not_the_compilers():
    program, state, batch = failing(f"{PROGRAMS / 'compiled_fault.py'}:make", step=0)
    o = origin_of(program.step, state, batch, None)
    assert o.cls == "unknown" and o.evidence["reason"] == "no-replay"


def test_a_step_that_cannot_be_evaluated_op_by_op_is_unknown_with_the_reason():
    program, state, batch = failing(WHOSE, kind="zero-over-zero")

    def refuses(*args):
        raise RuntimeError("custom kernel: no eager rule")

    def step(params, opt_state, b):
        p, o, aux = program.step(params, opt_state, b)
        bad = jax.pure_callback(refuses, jax.ShapeDtypeStruct((), jnp.float32), aux["loss"])
        return p, o, {"loss": aux["loss"] + bad}

    o = origin_of(step, state, batch, lambda: Replayed(False, ("x",)))
    assert o.cls == "unknown" and o.evidence["reason"] == "eager-failed"
    assert "custom kernel: no eager rule" in o.summary


def test_a_replay_that_raises_is_unknown_with_the_reason():
    program, state, batch = failing(WHOSE, kind="zero-over-zero")

    def replay():
        raise ValueError("device lost")

    o = origin_of(program.step, state, batch, replay)
    assert o.cls == "unknown" and "device lost" in o.summary


def test_jax_frames_are_not_the_users_line():
    site = Site((0,), "div", (
        SourceLine("/x/site-packages/optax/_src/transform.py", 300, "update"),
        SourceLine(str(PROGRAMS / "whose.py"), 42, "step"),
    ))
    where = locate(site, [str(PROGRAMS)])
    assert (where["file"], where["line"]) == (str(PROGRAMS / "whose.py"), 42)
    assert where["library"]["file"].endswith("optax/_src/transform.py")


@pytest.mark.parametrize("bad", [
    {"class": "maybe", "summary": "", "where": None, "evidence": {}},
    {"class": "input", "summary": 3, "where": None, "evidence": {}},
    {"class": "program", "summary": "", "where": {"file": 3, "line": 1}, "evidence": {}},
    {"class": "program", "summary": "", "where": {"file": "a.py", "line": True}, "evidence": {}},
    {"class": "input", "summary": "", "where": None, "evidence": []},
    ["input"],
])
def test_an_origin_that_is_not_one_is_refused(bad):
    with pytest.raises(ValueError):
        Origin.from_json(bad)


def test_an_origin_round_trips():
    o = explain(kind="log-zero")
    assert Origin.from_json(o.to_json()) == o



def test_a_sharded_step_is_decided_on_the_host_with_the_same_jaxpr():
    """Eight host devices (tests/conftest.py): the state and batch sharded over a mesh, the step jitted
    with their shardings; its origin and line are the unsharded program's."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    program, (params, opt_state), batch = failing(WHOSE, kind="zero-over-zero")
    rows = NamedSharding(mesh, P("d"))
    batch = {k: jax.device_put(v, rows if v.ndim and v.shape[0] % 8 == 0 else NamedSharding(mesh, P()))
             for k, v in batch.items()}
    params = jax.device_put(params, NamedSharding(mesh, P()))
    o = origin_of(program.step, (params, opt_state), batch, compiled_replay(program, params, opt_state, batch),
                  user_folders=[str(PROGRAMS)])
    assert len(batch["x"].sharding.device_set) == 8
    assert o.cls == "program" and o.where["line"] == planted_line("whose_losses.py", "zero-over-zero")


def test_a_sqrt_at_zero_in_the_gradient_is_named_as_such():
    def step(params, opt_state, b):
        loss, g = jax.value_and_grad(lambda p: jnp.sum(jnp.sqrt(p["w"] * b)))(params)
        return jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g), opt_state, {"loss": loss}

    o = origin_of(step, ({"w": jnp.ones(3)}, ()), jnp.array([1.0, 0.0, 2.0]), None, replays=0)
    assert o.cls == "program" and o.evidence["known_class"] == "sqrt-at-zero"
    assert o.where["file"] == __file__ and o.where["primitive"] == "div"


def _loss_step(loss):
    def step(params, opt_state, b):
        value, g = jax.value_and_grad(loss)(params, b)
        return jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g), opt_state, {"loss": value}

    return step


def test_a_non_finite_batch_leaf_the_failure_does_not_descend_from_is_not_the_input():
    """An attention bias of -inf in the batch (absorbed by exp) and a log(0) in the loss: the program's."""
    step = _loss_step(lambda p, b: jnp.sum(jnp.exp(b["bias"]) * p["w"]) + jnp.sum(jnp.log(p["w"] * b["x"])))
    batch = {"bias": jnp.array([0.0, -jnp.inf]), "x": jnp.array([1.0, 0.0])}
    o = origin_of(step, ({"w": jnp.ones(2)}, ()), batch, None, replays=0)
    assert o.cls == "program" and o.where["primitive"] == "log"
    assert o.evidence["nonfinite_inputs_not_used"][0]["leaf"] == "batch['bias']"
    bad = {"bias": jnp.array([0.0, -jnp.inf]), "x": jnp.array([1.0, jnp.nan])}  # a NaN the loss does use
    o = origin_of(step, ({"w": jnp.ones(2)}, ()), bad, None, replays=0)
    assert o.cls == "input" and [x["leaf"] for x in o.evidence["leaves"]] == ["batch['x']"]


def test_an_overflow_past_an_explicit_float32_cast_is_precision():
    step = _loss_step(lambda p, b: jnp.log(jnp.sum(jnp.exp((p["w"] * b).astype(jnp.float32)))))
    o = origin_of(step, ({"w": jnp.ones(2)}, ()), jnp.array([100.0, 1.0]), None, replays=0)
    assert o.cls == "precision" and o.where["primitive"] == "exp"


def test_a_weak_scalar_in_the_state_keeps_half_precision_arithmetic_half():
    """A weak float32 scale (optax.inject_hyperparams stores one) times float16 parameters is float16
    arithmetic: evaluated op by op with the weak type kept, it overflows float16 as the compiled step
    does (precision); promoted to float32 it would not, and the verdict would be the compiler's."""
    def step(params, opt_state, b):
        new = {"w": params["w"] * opt_state["scale"] * b}
        return new, opt_state, {"loss": jnp.mean(new["w"].astype(jnp.float32))}

    params = {"w": jnp.full((2,), 100.0, jnp.float16)}
    opt_state = {"scale": jnp.asarray(300.0)}
    assert opt_state["scale"].weak_type
    batch = jnp.array([10.0, 1.0], jnp.float16)
    assert not np.isfinite(np.asarray(jax.jit(step)(params, opt_state, batch)[0]["w"])).all()
    o = origin_of(step, (params, opt_state), batch, None, replays=0)
    assert o.cls == "precision" and o.where["primitive"] == "mul"


def test_a_library_inside_the_users_folder_is_still_a_library(tmp_path):
    lib = tmp_path / ".venv" / "lib" / "python3.12" / "site-packages" / "optax" / "_src" / "transform.py"
    site = Site((0,), "div", (SourceLine(str(lib), 300, "update"), SourceLine(str(tmp_path / "model.py"), 9, "step")))
    where = locate(site, [str(tmp_path)])
    assert (where["file"], where["line"]) == (str(tmp_path / "model.py"), 9) and where["library"]["line"] == 300
