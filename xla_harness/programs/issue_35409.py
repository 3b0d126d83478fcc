"""The jax-ml/jax#35409 preset: the reporter's model, batches and optimizer as a TrainProgram. Its
sizes, option levels, partition-spec tables and :class:`PresetConfig` are
:mod:`xla_harness.programs.issue_35409_config`'s; the model and the program (:func:`make`) are here.

What the report describes, kept here (``scale=1``):

* 16 transformer layers of which only the first 6 are used ("having unused layers seems
  necessary"); the 10 unused layers are still parameters, so they get (zero) gradients and
  AdamW updates in every step;
* D 2048, 16 heads (16 KV heads, head dim 128), gated MLP ``wd(silu(wg x) * wu x)`` with FFN 8192,
  RMS norms ``g * x / sqrt(mean(x.astype(f32) ** 2) + eps)`` cast back to x's dtype, causal
  attention, each used layer under ``jax.checkpoint`` (remat);
* a tied embedding W[100352, 2048]: the token lookup ``W[tokens]`` (a gather; its gradient is a
  scatter-add into W) and the output logits ``h @ W.T`` (a dot; its gradient is a dense update);
* two batches of different shapes, plain int32 token arrays (512, 32) and (16, 1024), uniform over
  the vocabulary;
* ``optax.adamw(1e-6)``; the step (loss, gradient and update) jitted as a whole;
* with more than one device, a 2-D ("model", "data") mesh and every weight sharded over both axes
  with the report's partition specs (``specs="report"``, the default,
  :data:`~xla_harness.programs.issue_35409_config.REPORT_SPECS`):
  ``wq``/``wk``/``wv`` (HEADS, hd, D) ``P("model", "data")`` (heads over "model", the head dim
  over "data", D whole), ``wo`` (D, HEADS, hd) ``P("data", "model")``, ``wg``/``wu`` (FFN, D)
  ``P("model", "data")``, ``wd`` (D, FFN) ``P("data", "model")``. The head dim is split over
  "data", so D is rounded to a multiple of heads x data (``scale=1/64`` on a (2, 4) mesh: D 64,
  not 32).

``specs="ours"`` (:data:`~xla_harness.programs.issue_35409_config.SPECS`) is the preset's earlier
reading, ``wq``/``wk``/``wv`` ("model", None, "data") (D over "data" instead of the head dim), kept
as a named variant so that results taken with it stay reproducible; its sizes are rounded as before.

What the report leaves open, and what this preset guesses:

* **axis types** (``axis_types="auto"``, the default): the report imports ``AxisType`` but shows
  no ``out_sharding`` annotations, and under Explicit axes its specs do not trace without them
  (the q/k/v projection of a batch split over "data" with a ``P("model", "data")`` weight would
  put "data" on two axes of its result: jax raises ``ShardingTypeError``), so the mesh has
  ``AxisType.Auto`` axes and the model no annotations; the shardings reach the step through jit's
  ``in_shardings``/``out_shardings`` (``jit_kwargs``). ``axis_types="explicit"`` is the preset's
  earlier path: Explicit axes, our own :data:`OUT_SPECS` on each contraction (with them the
  report's specs trace too);
* **the target logit**: under auto axes ``take_along_axis`` on the logits; under explicit axes a
  one-hot product (V is split over "model");
* **jit placement** (``jit``, :data:`JIT_PLACEMENTS`): the report jits the step as a whole but
  does not show how. ``jit="step"`` (the default): one ``jax.jit`` of the whole step with the
  state's and batches' shardings as ``in_shardings``/``out_shardings``; ``jit="bare"``: a bare
  ``jax.jit`` of the step, the shardings carried by the arrays only (the compiler picks the
  outputs'); ``jit="nested"``: as ``"step"``, with the loss and gradient under their own
  ``jax.jit`` inside the step (a gradient function jitted where it is defined);
* **donation** (``donate``): ``donate=True`` (the default) donates the parameters and optimizer
  state (``donate_argnums=(0, 1)``); ``donate=False`` donates nothing. The report does not say;
* **the embedding's spec** (``embed_spec``, default ``"model,data"``: V over "model", D over
  "data") and the norms' (replicated): the report does not show them. ``embed_spec`` takes any
  two of "model", "data" and "none" (e.g. ``"data,model"``, ``"model,none"``, ``"none,none"``
  for a replicated W); the batches split over "data" in ``in_shardings``;
* **dtype**: f32 parameters by default (``dtype="bf16"`` for bf16); the report's parameter dtype
  is not known. The RMS norm's eps (1e-5) is also ours;
* **matmul precision** (``precision``, :data:`~xla_harness.programs.precision.PRECISIONS`): the
  report names precision among the details that, changed, make the failure go away, and does not
  say which it used. ``precision="default"`` (the default) leaves the dots as jax writes them (or as
  a ``jax_default_matmul_precision`` set in the environment makes them: the harness records that
  setting); ``"high"`` and ``"highest"`` trace the step under ``jax.default_matmul_precision``, so
  every dot of the loss and its gradient carries that precision.

Each of these is recorded in ``options``, so that a compile matrix sweeps them by name
(``make tpu-sweep``: one at a time) and in combination (``make tpu-pairs``: every pair of their
levels, :mod:`xla_harness.stress.report.pairs`).

On one device the mesh, ``specs`` and ``axis_types`` play no part (the step lowers to the same
StableHLO whatever they are); in f32 it is also the StableHLO of the preset before these options
(compared once, when they were added), while with ``dtype="bf16"`` the norm now multiplies
``g * x`` in x's dtype, as the report writes it. Both options are recorded in ``options``.

Modes, as in the report: ``full`` (both paths differentiate W), ``sparse_only`` (W under
``stop_gradient`` in the output dot: only the scatter reaches W) and ``dense_only`` (W under
``stop_gradient`` in the lookup: only the dot reaches W).

``scale`` shrinks D, FFN, the vocabulary and the batch sizes (not the layer counts, heads or
sequence lengths) so the same program runs on a CPU: ``scale=1/32`` gives D 64, FFN 256,
V 3136, batches (16, 32) + (1, 1024). Sizes are rounded to what the heads and the mesh need (batch
sizes to a multiple of the "data" axis: (16, 32) + (4, 1024) on a (2, 4) mesh). The reporter says
small models do not trigger the failure; a scaled preset checks the harness, the full one measures
the bug. Measured on a 2-core CPU: ``scale=1/32`` compiles in about 10 s and runs about 3.5 s a
step on one device; on 8 host devices (``specs="ours", axis_types="explicit"``), 46 s and 29 s a
step. ``seq_scale`` and ``layers`` shrink it further for tests.

The model's ``lookup``/``unembed`` are the two uses of W; :mod:`xla_harness.programs.variants`
swaps them for the workaround variants (``make(variant="onehot")`` etc.).
"""

from __future__ import annotations

import math
from dataclasses import replace

from xla_harness.errors import HarnessError
from xla_harness.programs import options as opt
from xla_harness.programs.interface import TrainProgram, step_from_loss
from xla_harness.programs.issue_35409_config import (
    AXIS_TYPES,
    DEFAULT_EMBED_SPEC,
    DTYPES,
    JIT_PLACEMENTS,
    LR,
    MODES,
    SPEC_SETS,
    SPEC_TABLES,
    TOTAL_LAYERS,
    USED_LAYERS,
    PresetConfig,
    parse_embed_spec,
    scaled_config,
)
from xla_harness.programs.precision import PRECISIONS, with_matmul_precision
from xla_harness.programs.variants import VARIANTS

# ----------------------------------------------------------------------------- model


def init_params(cfg: PresetConfig, key):
    """Parameters as a dict pytree; ``embed`` is the tied W[V, D]; ``layers`` holds all
    ``total_layers`` layers, of which the forward pass uses the first ``used_layers``."""
    import jax
    import jax.numpy as jnp

    dt = jnp.bfloat16 if cfg.dtype == "bf16" else jnp.float32
    d, f, h, kvh, hd = cfg.d_model, cfg.ffn, cfg.heads, cfg.kv_heads, cfg.head_dim
    keys = jax.random.split(key, 1 + cfg.total_layers)

    def normal(k, shape, fan_in):
        return (jax.random.normal(k, shape, jnp.float32) / math.sqrt(fan_in)).astype(dt)

    layers = []
    for i in range(cfg.total_layers):
        k = jax.random.split(keys[1 + i], 7)
        layers.append({
            "norm1": jnp.ones((d,), dt),
            "wq": normal(k[0], (h, hd, d), d),
            "wk": normal(k[1], (kvh, hd, d), d),
            "wv": normal(k[2], (kvh, hd, d), d),
            "wo": normal(k[3], (d, h, hd), d),
            "norm2": jnp.ones((d,), dt),
            "wg": normal(k[4], (f, d), d),
            "wu": normal(k[5], (f, d), d),
            "wd": normal(k[6], (d, f), f),
        })
    return {"embed": normal(keys[0], (cfg.vocab, d), d), "layers": layers, "final_norm": jnp.ones((d,), dt)}


def _rms(x, g, eps=1e-5):
    """The report's RMS norm: ``g * x / sqrt(mean(x.astype(f32) ** 2) + eps)``, cast back to x's
    dtype (eps 1e-5 is a guess)."""
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    return (g * x / jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


# Output shardings of the step's contractions on the explicit ("model", "data") mesh: activations
# split over "data" on the batch, heads and FFN features over "model", logits over "model" on V.
OUT_SPECS = {
    "act": ("data", None, None),
    "heads": ("data", None, "model", None),
    "ffn": ("data", None, "model"),
    "logits": ("data", None, "model"),
}


def _out(mesh, name: str):
    """The out_sharding of contraction ``name`` on the explicit mesh; None on one device."""
    if mesh is None:
        return None
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh, P(*OUT_SPECS[name]))


def _layer(p, x, mesh=None):
    import jax
    import jax.numpy as jnp

    b, t, _ = x.shape
    h = _rms(x, p["norm1"])
    heads = _out(mesh, "heads")
    q = jnp.einsum("btd,hkd->bthk", h, p["wq"], out_sharding=heads)
    k = jnp.einsum("btd,hkd->bthk", h, p["wk"], out_sharding=heads)
    v = jnp.einsum("btd,hkd->bthk", h, p["wv"], out_sharding=heads)
    if k.shape[2] != q.shape[2]:  # grouped KV heads
        rep = q.shape[2] // k.shape[2]
        k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    att = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
    att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -1e30)
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(att, axis=-1).astype(x.dtype), v)
    x = x + jnp.einsum("bqhk,dhk->bqd", o, p["wo"], out_sharding=_out(mesh, "act"))
    h = _rms(x, p["norm2"])
    ffn = _out(mesh, "ffn")
    gate = jax.nn.silu(jnp.einsum("btd,fd->btf", h, p["wg"], out_sharding=ffn))
    up = jnp.einsum("btd,fd->btf", h, p["wu"], out_sharding=ffn)
    return x + jnp.einsum("btf,df->btd", gate * up, p["wd"], out_sharding=_out(mesh, "act"))


def make_loss(cfg: PresetConfig, ops=None, mesh=None):
    """``loss(params, batches)``: next-token cross-entropy summed over the batches.

    ``ops`` (a :class:`xla_harness.programs.variants.TiedOps`, default the baseline) writes the two
    uses of W; the mode's ``stop_gradient`` goes on W after ``ops.split``, so a variant replaces
    the operations, never the mode. ``mesh``: a mesh with explicit axes, whose :data:`OUT_SPECS`
    annotate the contractions and whose split V makes the target logit a one-hot product; None
    (one device, or auto axes): no annotations, the target logit picked with ``take_along_axis``."""
    import jax
    import jax.numpy as jnp

    from xla_harness import jaxcompat
    from xla_harness.programs import variants

    ops = ops or variants.tied_ops("baseline")
    layer = jax.checkpoint(_layer, static_argnums=(2,)) if cfg.remat else _layer

    def xent(params, tokens):
        w_in, w_out = ops.split(params["embed"])
        if cfg.mode == "dense_only":
            w_in = jax.lax.stop_gradient(w_in)
        if cfg.mode == "sparse_only":
            w_out = jax.lax.stop_gradient(w_out)
        x = ops.lookup(w_in, tokens[:, :-1], out_sharding=_out(mesh, "act"))
        for p in params["layers"][:cfg.used_layers]:
            x = layer(p, x, mesh)
        h = _rms(x, params["final_norm"])
        lg = ops.unembed(h, w_out, out_sharding=_out(mesh, "logits")).astype(jnp.float32)
        tgt = tokens[:, 1:]
        if mesh is not None:  # V is split over "model": pick the target logit with a one-hot product
            onehot = jaxcompat.one_hot(tgt, lg.shape[-1], dtype=lg.dtype, out_sharding=_out(mesh, "logits"))
            picked = jnp.sum(lg * onehot, axis=-1)
        else:
            picked = jnp.take_along_axis(lg, tgt[..., None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(lg, axis=-1) - picked)

    def loss(params, batches):
        return sum(xent(params, tokens) for tokens in batches)

    return loss


# ----------------------------------------------------------------------------- program


def _mesh(devices, mesh_shape, axis_types: str = "auto"):
    import jax
    from jax.sharding import AxisType

    kind = AxisType.Explicit if axis_types == "explicit" else AxisType.Auto
    return jax.make_mesh(mesh_shape, ("model", "data"), axis_types=(kind,) * 2, devices=devices)


def _step_shardings(mesh, cfg: PresetConfig, optimizer):
    """(params, opt_state, batches) shardings: weights per ``SPEC_TABLES[cfg.specs]``, Adam moments
    like their weights, the step count replicated, token batches split over "data"."""
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    abstract = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))
    params = _param_shardings(mesh, abstract, {**SPEC_TABLES[cfg.specs], "embed": cfg.embed_spec})
    replicated = NamedSharding(mesh, P())
    opt_abstract = jax.eval_shape(optimizer.init, abstract)
    opt = optax.tree_map_params(optimizer, lambda _, s: s, opt_abstract, params,
                                transform_non_params=lambda _: replicated)
    batches = tuple(NamedSharding(mesh, P("data", None)) for _ in cfg.batches)
    return params, opt, batches


def _param_shardings(mesh, params, table: dict):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def spec(path, _leaf):
        name = path[-1].key
        return NamedSharding(mesh, P(*table[name]))

    return jax.tree_util.tree_map_with_path(spec, params)


def _resolve_devices(devices):
    import jax

    if devices is None:
        return None
    if isinstance(devices, int):
        have = jax.devices()
        if devices <= 0:
            raise HarnessError(f"devices must be a positive integer, got {devices}")
        if devices > len(have):
            raise HarnessError(f"devices={devices} but this backend has {len(have)} devices")
        return have[:devices]
    return list(devices)


def _embed_spec(value):
    """The ``embed_spec`` option: W's partition spec as text or a pair (:func:`parse_embed_spec`)."""
    if not isinstance(value, str | tuple | list):
        raise ValueError('two of model, data, none as text ("model,data") or a pair')
    try:
        return parse_embed_spec(value)
    except HarnessError:
        raise ValueError('two of model, data, none, each axis once (e.g. "model,data", "model,none")') from None


# Every option of make(), checked by type and value before the program is built (one line each).
OPTIONS = opt.OptionTable("issue-35409", (
    opt.Option("scale", opt.number(0, 1), "D, FFN, vocabulary and batch sizes times this, in (0, 1]"),
    opt.Option("mode", opt.choice(*MODES), "which paths differentiate W"),
    opt.Option("devices", opt.optional(opt.device_count_or_list()), "a device count or the devices"),
    opt.Option("dtype", opt.choice(*DTYPES), "parameter dtype"),
    opt.Option("remat", opt.boolean(), "each used layer under jax.checkpoint"),
    opt.Option("variant", opt.choice(*VARIANTS), "a workaround variant of the two uses of W"),
    opt.Option("mesh_shape", opt.optional(opt.int_pair("model, data")), "the mesh's (model, data) sizes"),
    opt.Option("lr", opt.number(0), "AdamW learning rate"),
    opt.Option("seq_scale", opt.number(0, 1), "sequence lengths times this, in (0, 1]"),
    opt.Option("layers", opt.int_pair("used, total; used <= total", ordered=True), "(used, total) layers"),
    opt.Option("specs", opt.choice(*SPEC_SETS), "the weights' partition specs"),
    opt.Option("axis_types", opt.choice(*AXIS_TYPES), "the mesh's axis types"),
    opt.Option("embed_spec", _embed_spec, "W's partition spec"),
    opt.Option("donate", opt.boolean(), "donate parameters and optimizer state"),
    opt.Option("jit", opt.choice(*JIT_PLACEMENTS), "where jax.jit sits"),
    opt.Option("precision", opt.choice(*PRECISIONS), "the dots' matmul precision (default, high, highest)"),
))


@OPTIONS.checked
def make(scale: float = 1.0, mode: str = "full", devices=None, dtype: str = "f32", remat: bool = True,
         variant: str = "baseline", mesh_shape: tuple[int, int] | None = None, lr: float = LR,
         seq_scale: float = 1.0, layers: tuple[int, int] = (USED_LAYERS, TOTAL_LAYERS), specs: str = "report",
         axis_types: str = "auto", embed_spec=DEFAULT_EMBED_SPEC, donate: bool = True,
         jit: str = "step", precision: str = "default") -> TrainProgram:
    """The #35409 program. ``devices``: None (default device), a count or a device list; with more
    than one device the step runs on a ("model", "data") mesh (``mesh_shape``, default (2, n/2))
    with weights and batches sharded and ``jit_kwargs`` carrying the shardings. ``specs``: the
    report's partition specs (``"report"``) or the preset's earlier ones (``"ours"``);
    ``axis_types``: ``"auto"`` (no sharding annotations in the model) or ``"explicit"`` (the
    :data:`OUT_SPECS` annotations); ``embed_spec``: W's partition spec. These only matter on a mesh.
    ``donate``: donate parameters and optimizer state (the default) or nothing; ``jit``: where jit
    sits (:data:`JIT_PLACEMENTS`, see the module docstring); ``precision``: the dots' matmul precision
    (``default``, ``high``, ``highest``). All are recorded in ``options``."""
    import jax
    import jax.numpy as jnp
    import optax

    from xla_harness.programs import variants

    devs = _resolve_devices(devices)
    n = len(devs) if devs else 1
    if mesh_shape is None:
        mesh_shape = (2, n // 2) if n > 1 else (1, 1)
    dims = tuple(int(x) for x in mesh_shape)  # a list or any other pair of ints is accepted too
    if len(dims) != 2 or dims[0] * dims[1] != n:
        raise HarnessError(f"mesh_shape {dims} does not use exactly {n} devices")
    mesh_shape = (dims[0], dims[1])
    cfg = scaled_config(scale, mode=mode, remat=remat, dtype=dtype, mesh_shape=mesh_shape, variant=variant,
                        seq_scale=seq_scale, layers=layers, specs=specs, axis_types=axis_types,
                        embed_spec=embed_spec, precision=precision)
    _check_step_options(jit, donate, lr)
    cfg = replace(cfg, lr=float(lr))
    mesh = _mesh(devs, mesh_shape, cfg.axis_types) if n > 1 else None
    optimizer = optax.adamw(cfg.lr)
    # Auto axes: the model carries no out_sharding annotations and picks the target logit with
    # take_along_axis; the shardings reach the step only through jit's in/out_shardings.
    annotate = mesh if cfg.axis_types == "explicit" else None
    loss = make_loss(cfg, variants.tied_ops(variant), annotate)
    step = _nested_step(loss, optimizer) if jit == "nested" else step_from_loss(loss, optimizer)
    step = with_matmul_precision(step, cfg.precision)

    def make_batches(key, step_index):
        k = jax.random.fold_in(key, step_index)
        return tuple(jax.random.randint(jax.random.fold_in(k, i), (b, t), 0, cfg.vocab, dtype=jnp.int32)
                     for i, (b, t) in enumerate(cfg.batches))

    def make_state(key):
        params = init_params(cfg, key)
        return params, optimizer.init(params)

    # init and batches are jitted so that at full size each device builds only its own shards.
    jit_kwargs: dict = {}
    if mesh is not None:
        p_sh, o_sh, b_sh = _step_shardings(mesh, cfg, optimizer)
        if jit != "bare":  # "bare": the arrays carry the shardings, jit is given none
            jit_kwargs = {"in_shardings": (p_sh, o_sh, b_sh), "out_shardings": (p_sh, o_sh, None)}
        init = jax.jit(make_state, out_shardings=(p_sh, o_sh))
        batch = jax.jit(make_batches, out_shardings=b_sh)
    else:
        init, batch = jax.jit(make_state), jax.jit(make_batches)
    name = "issue-35409" + ("" if variant == "baseline" else f"+{variant}")
    return TrainProgram(name=name, init=init, batch=batch, step=step, donate_argnums=(0, 1) if donate else (),
                        jit_kwargs=jit_kwargs,
                        options={**cfg.to_dict(), "scale": scale, "devices": n, "donate": donate, "jit": jit})


def _check_step_options(jit, donate, lr) -> None:
    if jit not in JIT_PLACEMENTS:
        raise HarnessError(f"unknown jit {jit!r}; expected one of {', '.join(JIT_PLACEMENTS)}")
    if not isinstance(donate, bool):
        raise HarnessError(f"donate must be True or False, got {donate!r}")
    if not (isinstance(lr, int | float) and lr > 0):
        raise HarnessError(f"lr must be a positive number, got {lr!r}")


def check_options(devices: int = 8, **options) -> None:
    """Validate the options of one :func:`make` without jax: the checks ``make`` does before it
    builds anything, for ``devices`` devices (a count). HarnessError names the first bad value; an
    option ``make`` does not take is one too."""
    import inspect

    known = set(inspect.signature(make).parameters) - {"devices"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise HarnessError(f"issue-35409 takes no option {unknown[0]!r}; its options: {', '.join(sorted(known))}")
    options = OPTIONS.validate(options)  # each value by its type and range, as make() checks it
    defaults = {k: p.default for k, p in inspect.signature(make).parameters.items() if k != "devices"}
    o = {**defaults, **options}
    mesh_shape = o["mesh_shape"] or ((2, devices // 2) if devices > 1 else (1, 1))
    scaled_config(o["scale"], mode=o["mode"], remat=o["remat"], dtype=o["dtype"], mesh_shape=tuple(mesh_shape),
                  variant=o["variant"], seq_scale=o["seq_scale"], layers=o["layers"], specs=o["specs"],
                  axis_types=o["axis_types"], embed_spec=o["embed_spec"], precision=o["precision"])
    if o["variant"] != "baseline":
        from xla_harness.programs import variants

        variants.tied_ops(o["variant"])
    _check_step_options(o["jit"], o["donate"], o["lr"])


def _nested_step(loss_fn, optimizer):
    """The optax step of :func:`step_from_loss` with the loss and gradient under their own
    ``jax.jit`` (``jit="nested"``): the step's jaxpr holds the gradient as a nested jit call."""
    import jax
    import optax

    loss_and_grad = jax.jit(jax.value_and_grad(loss_fn))

    def step(params, opt_state, batch):
        loss, grads = loss_and_grad(params, batch)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt_state, {"loss": loss}

    return step

