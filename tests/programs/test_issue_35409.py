"""The #35409 preset: the reporter's sizes, a step that runs, the tied pattern in its compiled HLO."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_harness.errors import HarnessError
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.tied import tied_summary
from xla_harness.programs import issue_35409, issue_35409_config
from xla_harness.programs.interface import TrainProgram, load_program
from xla_harness.targets import parse_target
from xla_harness.targets.devices import missing

# Small enough to compile in seconds on a CI core: D 32, V 1568, sequences 4 and 128.
SMALL = dict(scale=1 / 64, seq_scale=1 / 8, layers=(1, 2))
ROOT = Path(__file__).resolve().parents[2]


def compiled(program: TrainProgram, seed: int = 0):
    key = jax.random.key(seed)
    params, opt_state = program.init(key)
    batch = program.batch(key, 0)
    return program.jit().lower(params, opt_state, batch).compile(), (params, opt_state, batch)


def w_dims(program: TrainProgram) -> tuple[int, int]:
    return program.options["vocab"], program.options["d_model"]


def test_full_scale_matches_the_report_without_allocating():
    program = issue_35409.make()
    cfg = issue_35409_config.scaled_config(1.0)
    params = jax.eval_shape(lambda k: issue_35409.init_params(cfg, k), jax.random.key(0))
    assert params["embed"].shape == (100352, 2048)
    assert len(params["layers"]) == 16 and cfg.used_layers == 6
    layer = params["layers"][0]
    assert layer["wq"].shape == (16, 128, 2048) and layer["wo"].shape == (2048, 16, 128)
    assert layer["wg"].shape == layer["wu"].shape == (8192, 2048) and layer["wd"].shape == (2048, 8192)
    batches = jax.eval_shape(lambda k: program.batch(k, 0), jax.random.key(0))
    assert [b.shape for b in batches] == [(512, 32), (16, 1024)]
    assert program.options["lr"] == 1e-6 and program.name == "issue-35409"
    assert program.options["specs"] == "report" and program.options["axis_types"] == "auto"


def test_scale_shrinks_width_vocab_and_batch_only():
    cfg = issue_35409_config.scaled_config(1 / 32)
    assert (cfg.d_model, cfg.ffn, cfg.vocab) == (64, 256, 3136)
    assert cfg.batches == ((16, 32), (1, 1024))
    assert (cfg.used_layers, cfg.total_layers, cfg.heads) == (6, 16, 16)
    # On a (2, 4) mesh every sharded size is divisible by both axes and batches by "data".
    cfg = issue_35409_config.scaled_config(1 / 64, mesh_shape=(2, 4))
    assert cfg.vocab % 8 == 0 and cfg.d_model % 16 == 0 and all(b % 4 == 0 for b, _ in cfg.batches)


@pytest.mark.parametrize("bad", [dict(scale=0), dict(scale=2), dict(mode="tied"), dict(dtype="f16"),
                                 dict(layers=(5, 4)), dict(devices=3, mesh_shape=(2, 2)), dict(devices=0),
                                 dict(lr=0), dict(seq_scale=0), dict(specs="mine"), dict(specs=None),
                                 dict(axis_types="manual"), dict(axis_types="Auto"), dict(embed_spec="model"),
                                 dict(embed_spec="data,data"), dict(embed_spec="model,batch"),
                                 dict(embed_spec=3), dict(embed_spec="model,data,none"), dict(jit="outer"),
                                 dict(donate="yes"), dict(donate=1)])
def test_bad_options_raise_one_sentence(bad):
    with pytest.raises(HarnessError) as e:
        issue_35409.make(**bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad, says", [
    (dict(specs="mine"), "--program issue-35409: option specs must be one of report, ours, got 'mine'"),
    (dict(axis_types="manual"),
     "--program issue-35409: option axis_types must be one of auto, explicit, got 'manual'")])
def test_bad_specs_and_axis_types_name_the_choices(bad, says):
    with pytest.raises(HarnessError) as got:
        issue_35409.make(**bad)
    assert str(got.value) == says


def test_builtin_name_resolves_to_the_preset():
    program = load_program("issue-35409", **SMALL)
    assert isinstance(program, TrainProgram) and program.options["vocab"] == 1568


@pytest.fixture(scope="module")
def full_small():
    program = issue_35409.make(**SMALL)
    return program, *compiled(program)


@pytest.mark.slow
def test_step_runs_and_trains(full_small):
    program, exe, (params, opt_state, batch) = full_small
    w0 = np.asarray(params["embed"]).copy()
    new_params, new_opt, aux = exe(params, opt_state, batch)
    assert np.isfinite(float(aux["loss"])) and float(aux["loss"]) > 0
    assert not np.array_equal(np.asarray(new_params["embed"]), w0)
    # Used layers get gradients; unused ones are parameters with zero gradients (Adam moments stay 0).
    mu = new_opt[0].mu["layers"]
    assert np.any(np.asarray(mu[0]["wg"]) != 0) and not np.any(np.asarray(mu[1]["wg"]))
    assert int(new_opt[0].count) == 1


def test_compiled_step_has_the_tied_pattern(full_small):
    program, exe, _ = full_small
    summary = tied_summary(parse_module(exe.as_text()), w_dims(program))
    assert summary.gathers >= 1  # the lookup reads W
    assert summary.dots_reading >= 1  # the logits read W
    assert summary.dots > summary.dots_reading  # W's dense gradient is a dot
    assert summary.scatters  # the lookup's gradient is a scatter into W's shape ...
    assert summary.scatter_onto_dense >= 1  # ... updating the dense gradient in place


@pytest.mark.slow
@pytest.mark.parametrize("mode, scatter_sources", [("sparse_only", {"broadcast"}), ("dense_only", set())])
def test_modes_cut_one_gradient_path(mode, scatter_sources):
    program = issue_35409.make(**SMALL, mode=mode)
    exe, _ = compiled(program)
    summary = tied_summary(parse_module(exe.as_text()), w_dims(program))
    assert {s.in_place_source for s in summary.scatters} == scatter_sources
    assert summary.scatter_onto_dense == 0


@pytest.mark.slow
def test_two_d_mesh_with_eight_host_devices():
    script = textwrap.dedent("""
        import json, sys
        import jax
        from xla_harness.programs import issue_35409
        from xla_harness.hlo.parser import parse_module
        from xla_harness.hlo.tied import tied_summary
        out = {}
        for variant in ("baseline", "barrier"):
            program = issue_35409.make(scale=1 / 64, seq_scale=1 / 8, layers=(1, 2), devices=8, variant=variant,
                                       specs="ours", axis_types="explicit")
            key = jax.random.key(0)
            params, opt_state = program.init(key)
            exe = program.jit().lower(params, opt_state, program.batch(key, 0)).compile()
            losses = []
            for i in range(2):
                params, opt_state, aux = exe(params, opt_state, program.batch(key, i))
                losses.append(float(aux["loss"]))
            v, d = program.options["vocab"], program.options["d_model"]
            s = tied_summary(parse_module(exe.as_text()), (v // 2, d // 4))
            out[variant] = {
                "mesh": dict(params["embed"].sharding.mesh.shape),
                "axis_types": [str(t) for t in params["embed"].sharding.mesh.axis_types],
                "specs": {k: list(params["layers"][0][k].sharding.spec) for k in ("wq", "wo", "wg", "wd")},
                "embed": list(params["embed"].sharding.spec),
                "mu": list(opt_state[0].mu["embed"].sharding.spec),
                "losses": losses,
                "sources": [site["in_place_source"] for site in s.to_json()["scatters"]],
                "gathers": s.gathers}
        json.dump(out, sys.stdout)
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    base, barrier = out["baseline"], out["barrier"]
    assert base["mesh"] == {"model": 2, "data": 4}
    assert base["axis_types"] == ["AxisType.Explicit"] * 2
    assert base["embed"] == base["mu"] == ["model", "data"]
    assert base["specs"]["wg"] == ["model", "data"] and base["specs"]["wd"] == ["data", "model"]
    assert base["specs"]["wq"] == ["model", None, "data"] and base["specs"]["wo"] == ["data", "model", None]
    assert all(np.isfinite(base["losses"]))
    # Each device holds a [V/2, D/4] shard of W: the lookup gathers from it and the lookup's gradient
    # is scattered onto the (all-reduced, sliced) dense gradient; with the barrier, onto fresh zeros.
    assert base["gathers"] >= 1 and "dense" in base["sources"]
    assert barrier["sources"] and set(barrier["sources"]) == {"broadcast"}
    np.testing.assert_allclose(barrier["losses"], base["losses"], rtol=1e-5)


@pytest.mark.slow
def test_bf16_and_no_remat_options():
    program = issue_35409.make(scale=1 / 64, dtype="bf16", remat=False)
    params, opt_state = jax.eval_shape(program.init, jax.random.key(0))
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert program.options["dtype"] == "bf16" and program.options["remat"] is False
    jaxpr = str(jax.make_jaxpr(program.step)(params, opt_state, program.batch(jax.random.key(0), 0)))
    assert "remat" not in jaxpr and "checkpoint" not in jaxpr
    with_remat = issue_35409.make(scale=1 / 64)
    params, opt_state = jax.eval_shape(with_remat.init, jax.random.key(0))
    jaxpr = str(jax.make_jaxpr(with_remat.step)(params, opt_state, with_remat.batch(jax.random.key(0), 0)))
    assert "checkpoint" in jaxpr or "remat" in jaxpr


def test_batches_are_uniform_over_the_vocabulary():
    program = issue_35409.make(scale=1 / 64)
    a, b = program.batch(jax.random.key(1), 0)
    assert a.dtype == b.dtype == jnp.int32
    vocab = program.options["vocab"]
    both = np.concatenate([np.asarray(a).ravel(), np.asarray(b).ravel()])
    assert both.min() >= 0 and both.max() < vocab
    # uniform: the top half of the vocabulary is drawn about as often as the bottom half
    assert abs(np.mean(both >= vocab // 2) - 0.5) < 0.05
    assert not np.array_equal(np.asarray(program.batch(jax.random.key(1), 1)[0]), np.asarray(a))


# ----------------------------------------------------------------------------- specs and axis types


def abstract_state(program: TrainProgram):
    return jax.eval_shape(program.init, jax.random.key(0))


def test_report_specs_split_the_head_dim_over_data():
    """specs="report": wq/wk/wv (HEADS, hd, D) are P("model", "data"), hd over "data"; "ours" keeps
    the earlier ("model", None, "data"). The other weights are the same in both."""
    P = jax.sharding.PartitionSpec
    report = issue_35409.make(**SMALL, devices=8)
    ours = issue_35409.make(**SMALL, devices=8, specs="ours")
    (rp, ro), (op, oo) = abstract_state(report), abstract_state(ours)
    for name in ("wq", "wk", "wv"):
        assert rp["layers"][0][name].sharding.spec == P("model", "data")
        assert ro[0].mu["layers"][0][name].sharding.spec == P("model", "data")  # Adam moments follow
        assert op["layers"][0][name].sharding.spec == P("model", None, "data")
        assert oo[0].mu["layers"][0][name].sharding.spec == P("model", None, "data")
    assert rp["layers"][0]["wo"].sharding.spec == P("data", "model")
    assert op["layers"][0]["wo"].sharding.spec == P("data", "model", None)
    for name, spec in (("wg", P("model", "data")), ("wu", P("model", "data")), ("wd", P("data", "model"))):
        assert rp["layers"][1][name].sharding.spec == op["layers"][1][name].sharding.spec == spec
    assert rp["embed"].sharding.spec == op["embed"].sharding.spec == P("model", "data")
    assert (report.options["specs"], ours.options["specs"]) == ("report", "ours")
    # hd is split over the 4-way "data" axis, so D is a multiple of 16 heads x 4 (64, not 32).
    assert (report.options["d_model"], ours.options["d_model"]) == (64, 32)
    assert rp["layers"][0]["wq"].shape == (16, 4, 64)


def test_axis_types_set_the_mesh():
    auto = issue_35409.make(**SMALL, devices=8)
    explicit = issue_35409.make(**SMALL, devices=8, axis_types="explicit")
    AxisType = jax.sharding.AxisType
    assert abstract_state(auto)[0]["embed"].sharding.mesh.axis_types == (AxisType.Auto,) * 2
    assert abstract_state(explicit)[0]["embed"].sharding.mesh.axis_types == (AxisType.Explicit,) * 2
    assert (auto.options["axis_types"], explicit.options["axis_types"]) == ("auto", "explicit")
    for program in (auto, explicit):  # jit carries the param/opt/batch shardings either way
        params_sh, opt_sh, batch_sh = program.jit_kwargs["in_shardings"]
        assert params_sh["embed"].spec == jax.sharding.PartitionSpec("model", "data")
        assert [b.spec for b in batch_sh] == [jax.sharding.PartitionSpec("data", None)] * 2


def test_report_specs_need_annotations_under_explicit_axes():
    """Why auto axes are the likelier reading: under Explicit axes, without an out_sharding, the q
    projection with the report's wq spec does not trace (its result would have "data" on both the
    batch and the head dim); with the earlier spec it does."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("model", "data"), axis_types=(AxisType.Explicit,) * 2)
    h = jax.ShapeDtypeStruct((8, 4, 64), jnp.float32, sharding=NamedSharding(mesh, P("data", None, None)))

    def q_proj(spec):
        wq = jax.ShapeDtypeStruct((16, 4, 64), jnp.float32, sharding=NamedSharding(mesh, P(*spec)))
        return jax.jit(lambda h, w: jnp.einsum("btd,hkd->bthk", h, w)).trace(h, wq)

    with pytest.raises(Exception, match="illegally sharded result"):
        q_proj(issue_35409_config.REPORT_SPECS["wq"])
    assert q_proj(issue_35409_config.SPECS["wq"]).out_info.sharding.spec == P("data", None, "model", None)


def test_one_device_ignores_specs_and_axis_types():
    def lowered(program):
        params, opt_state = abstract_state(program)
        batch = jax.eval_shape(lambda k: program.batch(k, 0), jax.random.key(0))
        return program.jit().lower(params, opt_state, batch).as_text()

    default = issue_35409.make(**SMALL)
    assert lowered(default) == lowered(issue_35409.make(**SMALL, specs="ours", axis_types="explicit"))


@pytest.fixture(scope="module")
def on_mesh():
    """One AdamW step from the same initial state for three readings on a (4, 2) mesh of the 8 host
    devices; on that mesh both specs give the same sizes (D 32), so the same parameters."""
    out = {}
    for specs, axes in (("report", "auto"), ("report", "explicit"), ("ours", "auto")):
        program = issue_35409.make(**SMALL, devices=8, mesh_shape=(4, 2), specs=specs, axis_types=axes)
        exe, (params, opt_state, batch) = compiled(program)
        wq = params["layers"][0]["wq"].sharding.spec
        _, _, aux = exe(params, opt_state, batch)
        out[specs, axes] = {"program": program, "hlo": exe.as_text(), "loss": float(aux["loss"]), "wq": wq}
    return out


@pytest.mark.slow
def test_auto_and_explicit_axes_compile_and_run(on_mesh):
    auto, explicit = on_mesh["report", "auto"], on_mesh["report", "explicit"]
    assert np.isfinite(auto["loss"]) and np.isfinite(explicit["loss"]) and auto["loss"] > 0
    assert auto["hlo"] != explicit["hlo"]
    np.testing.assert_allclose(auto["loss"], explicit["loss"], rtol=1e-5)


@pytest.mark.slow
def test_both_specs_give_the_same_loss(on_mesh):
    report, ours = on_mesh["report", "auto"], on_mesh["ours", "auto"]
    assert report["program"].options["d_model"] == ours["program"].options["d_model"] == 32
    assert report["wq"] == jax.sharding.PartitionSpec("model", "data") != ours["wq"]
    assert report["hlo"] != ours["hlo"]  # different shardings, ...
    np.testing.assert_allclose(report["loss"], ours["loss"], rtol=1e-5)  # ... same math


@pytest.mark.slow
@pytest.mark.skipif(missing(parse_target("tpu:v6e:2x4")) is not None, reason="libtpu is not installed")
def test_faithful_program_compiles_for_tpu():
    from xla_harness.stress.compile_only.run import compile_program

    step = compile_program("issue-35409", {**SMALL, "specs": "report"}, parse_target("tpu:v6e:2x4"))
    assert ":T(8,128)" in step.hlo_text
    assert step.device_kind == "TPU v6 lite"


# ----------------------------------------------------------------------------- the report's unknowns


def lowered_text(program: TrainProgram) -> str:
    params, opt_state = abstract_state(program)
    batch = jax.eval_shape(lambda k: program.batch(k, 0), jax.random.key(0))
    return program.jit().lower(params, opt_state, batch).as_text()


@pytest.mark.parametrize("text, spec", [("model,data", ("model", "data")), ("data,model", ("data", "model")),
                                        ("model,none", ("model", None)), ("none, data", (None, "data")),
                                        ("none,none", (None, None)), (("data", None), ("data", None))])
def test_embed_spec_places_w_and_its_moments(text, spec):
    P = jax.sharding.PartitionSpec
    program = issue_35409.make(**SMALL, devices=8, embed_spec=text)
    params, opt_state = abstract_state(program)
    assert params["embed"].sharding.spec == opt_state[0].mu["embed"].sharding.spec == P(*spec)
    assert params["layers"][0]["wq"].sharding.spec == P("model", "data")  # the other weights keep theirs
    assert program.options["embed_spec"] == ",".join(a or "none" for a in spec)


def test_default_options_are_recorded():
    options = issue_35409.make(**SMALL).options
    assert (options["embed_spec"], options["donate"], options["jit"]) == ("model,data", True, "step")


def test_donate_false_donates_nothing():
    donating, keeping = (issue_35409.make(**SMALL, devices=8, donate=d) for d in (True, False))
    assert (donating.donate_argnums, keeping.donate_argnums) == ((0, 1), ())
    donating_text, keeping_text = lowered_text(donating), lowered_text(keeping)
    assert "tf.aliasing_output" in donating_text
    assert "tf.aliasing_output" not in keeping_text and "jax.buffer_donor" not in keeping_text


def test_bare_jit_leaves_the_shardings_to_the_arrays():
    """jit="bare": jit is given no shardings; the state still carries the report's specs (from init),
    so the inputs are sharded as with jit="step" and only the outputs' shardings are left open."""
    step, bare = (issue_35409.make(**SMALL, devices=8, jit=j) for j in ("step", "bare"))
    assert set(step.jit_kwargs) == {"in_shardings", "out_shardings"} and bare.jit_kwargs == {}
    assert abstract_state(bare)[0]["embed"].sharding.spec == jax.sharding.PartitionSpec("model", "data")
    step_text, bare_text = lowered_text(step), lowered_text(bare)
    result = 'jax.result_info = "result[0][\'embed\']"'
    assert f'{result}, sdy.sharding' in step_text and f'{result}, sdy.sharding' not in bare_text
    # W, the first argument, enters sharded either way (donated: aliased to its output, or a donor).
    w_in = 'sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {"data"}]>'
    assert f"%arg0: tensor<1568x64xf32> {{{w_in}, tf.aliasing_output = 0 : i32}}" in step_text
    assert f"%arg0: tensor<1568x64xf32> {{jax.buffer_donor = true, {w_in}}}" in bare_text


def test_nested_jit_holds_the_gradient_as_its_own_function():
    step, nested = (issue_35409.make(**SMALL, jit=j) for j in ("step", "nested"))
    assert "func.func private @loss" in lowered_text(nested)
    assert "func.func private @loss" not in lowered_text(step)


@pytest.mark.slow
def test_jit_placements_and_donation_compute_the_same_step():
    """Where jit sits and what is donated change the program, not its math: one step from the same
    state gives the same loss and the same new W on the (2, 4) host mesh."""
    results = {}
    for kw in (dict(), dict(jit="bare"), dict(jit="nested"), dict(donate=False), dict(embed_spec="data,model")):
        program = issue_35409.make(**SMALL, devices=8, **kw)
        exe, (params, opt_state, batch) = compiled(program)
        new_params, _, aux = exe(params, opt_state, batch)
        results[json.dumps(kw)] = (float(aux["loss"]), np.asarray(new_params["embed"]))
    base_loss, base_w = results["{}"]
    for loss, w in results.values():
        np.testing.assert_allclose(loss, base_loss, rtol=1e-5)
        np.testing.assert_allclose(w, base_w, rtol=1e-5, atol=1e-7)
