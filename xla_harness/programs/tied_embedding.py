"""A small decoder whose embedding matrix W[V, D] is used twice.

* token lookup ``W[tokens]`` (a gather; its backward pass is a scatter-add into W), and
* output logits ``h @ W.T`` (a dot; its backward pass is a dense update of W).

Two gradient paths into one parameter is the pattern of jax-ml/jax#35409: XLA may fuse
the scatter-add with a transpose of the shared buffer. The three modes switch the paths:

``full``         both paths differentiate W (the reported configuration);
``sparse_only``  the output projection uses a separate, untied matrix U[V, D];
``dense_only``   the lookup reads W under ``stop_gradient``, so only the dot differentiates W.

Each loss evaluates two heterogeneous batches (different sequence lengths and token
distributions). Everything is a pure function of (config, params, key).

:func:`program` wraps the model as a :class:`~xla_harness.programs.interface.TrainProgram`
(registered as the built-in ``tied-embedding``): a plain optax Adam step, parameters and
optimizer state donated, and with ``devices > 1`` a 1-D ``("data",)`` mesh with the batch
split and the tied matrix sharded on its vocabulary axis.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp

from xla_harness.errors import HarnessError
from xla_harness.programs import interface
from xla_harness.programs import options as opt
from xla_harness.programs.precision import PRECISIONS, check_precision, with_matmul_precision
from xla_harness.programs.variants import VARIANTS

MODES = ("full", "sparse_only", "dense_only")
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    mode: str = "full"
    remat: bool = True
    dtype: str = "f32"
    vocab: int = 256
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    seq: int = 16
    batch: int = 8
    precision: str = "default"  # the dots' matmul precision (xla_harness.programs.precision)

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if self.mode not in MODES:
            raise HarnessError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            raise HarnessError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        for name in ("vocab", "d_model", "layers", "heads", "seq", "batch"):
            if int(getattr(self, name)) <= 0:
                raise HarnessError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise HarnessError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.seq < 2:
            raise HarnessError("seq must be at least 2 (inputs and next-token targets)")

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    def label(self) -> str:
        return interface.label(self.to_dict())

    def to_dict(self) -> dict:
        return asdict(self)


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Parameters as a dict pytree; ``embed`` is the tied matrix W[V, D]."""
    dt = cfg.jnp_dtype
    d, f = cfg.d_model, 4 * cfg.d_model
    keys = jax.random.split(key, 2 + cfg.layers)

    def dense(k, shape, fan_in):
        return (jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(fan_in)).astype(dt)

    layers = []
    for i in range(cfg.layers):
        k = jax.random.split(keys[2 + i], 6)
        layers.append({
            "norm1": jnp.ones((d,), dt),
            "wqkv": dense(k[0], (d, 3 * d), d),
            "wo": dense(k[1], (d, d), d),
            "norm2": jnp.ones((d,), dt),
            "w1": dense(k[2], (d, f), d),
            "w2": dense(k[3], (f, d), f),
        })
    params = {
        "embed": (0.02 * jax.random.normal(keys[0], (cfg.vocab, d), jnp.float32)).astype(dt),
        "layers": layers,
        "final_norm": jnp.ones((d,), dt),
    }
    if cfg.mode == "sparse_only":
        params["unembed"] = (0.02 * jax.random.normal(keys[1], (cfg.vocab, d), jnp.float32)).astype(dt)
    return params


def _acc(x):
    """Accumulation precision: float32 for bf16/f32 models, float64 for the float64 reference."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _rms_norm(x, scale):
    xa = _acc(x)
    y = xa * jax.lax.rsqrt(jnp.mean(xa * xa, axis=-1, keepdims=True) + 1e-6)
    return (y * _acc(scale)).astype(x.dtype)


def _block(p, x, heads: int):
    b, s, d = x.shape
    hd = d // heads
    h = _rms_norm(x, p["norm1"])
    q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
    q, k, v = (t.reshape(b, s, heads, hd) for t in (q, k, v))
    att = _acc(jnp.einsum("bqhd,bkhd->bhqk", q, k)) / jnp.sqrt(hd)
    causal = jnp.tril(jnp.ones((s, s), bool))
    att = jnp.where(causal, att, -1e30)
    att = jax.nn.softmax(att, axis=-1).astype(x.dtype)
    o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d)
    x = x + o @ p["wo"]
    h = _rms_norm(x, p["norm2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def logits(params: dict, tokens: jax.Array, cfg: ModelConfig, ops=None) -> jax.Array:
    """Forward pass: tokens [B, S] int32 -> logits [B, S, V] (float32, float64 for the reference).

    ``ops`` (a :class:`xla_harness.programs.variants.TiedOps`) writes the two uses of W for a
    workaround variant; None is the model as written."""
    w = params["embed"]
    w_out_tied = w
    if ops is not None:
        w, w_out_tied = ops.split(w)
    w_lookup = jax.lax.stop_gradient(w) if cfg.mode == "dense_only" else w
    # Lookup: a gather; backward: scatter-add into W.
    x = jnp.take(w_lookup, tokens, axis=0) if ops is None else ops.lookup(w_lookup, tokens)
    block = jax.checkpoint(_block, static_argnums=(2,)) if cfg.remat else _block
    for p in params["layers"]:
        x = block(p, x, cfg.heads)
    h = _rms_norm(x, params["final_norm"])
    w_out = params["unembed"] if cfg.mode == "sparse_only" else w_out_tied
    if ops is not None:
        return _acc(ops.unembed(h, w_out))
    return _acc(h @ w_out.T)  # dot; backward: dense update of W


def make_batches(cfg: ModelConfig, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two heterogeneous token batches: [B, S] uniform over the vocabulary, and [B, 2S]
    drawn from the first eighth of the vocabulary (many repeated rows in the scatter)."""
    ka, kb = jax.random.split(key)
    a = jax.random.randint(ka, (cfg.batch, cfg.seq), 0, cfg.vocab, dtype=jnp.int32)
    hot = max(1, cfg.vocab // 8)
    b = jax.random.randint(kb, (cfg.batch, 2 * cfg.seq), 0, hot, dtype=jnp.int32)
    return a, b


def _xent(params, tokens, cfg, ops=None):
    lg = logits(params, tokens[:, :-1], cfg, ops)
    tgt = tokens[:, 1:]
    logz = jax.nn.logsumexp(lg, axis=-1)
    picked = jnp.take_along_axis(lg, tgt[..., None], axis=-1)[..., 0]
    return jnp.mean(logz - picked)


def loss_fn(params: dict, batches: tuple[jax.Array, jax.Array], cfg: ModelConfig, ops=None) -> jax.Array:
    """Mean next-token cross-entropy over both batches (float32 scalar)."""
    a, b = batches
    return _xent(params, a, cfg, ops) + _xent(params, b, cfg, ops)


# ----------------------------------------------------------------------------- as a TrainProgram


def _device_list(devices) -> list:
    """``devices`` as a list: a count takes the first N of this backend's devices; a sequence of
    devices (e.g. a TPU topology's, for an ahead-of-time compile) is used as given."""
    if isinstance(devices, int):
        if devices <= 0:
            raise HarnessError(f"devices must be a positive integer, got {devices}")
        avail = jax.devices()
        if len(avail) < devices:
            raise HarnessError(
                f"--devices {devices} requested but only {len(avail)} {jax.default_backend()} "
                "device(s) are visible (on CPU the CLI sets --xla_force_host_platform_device_count)")
        return list(avail[:devices])
    out = list(devices)
    if not out:
        raise HarnessError("devices is an empty list")
    return out


def _mesh_shardings(cfg: ModelConfig, devices: list, optimizer):
    """(params, opt_state, batch, replicated) shardings on a 1-D ``("data",)`` mesh of ``devices``."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    if cfg.vocab % n or cfg.batch % n:
        raise HarnessError(f"with --devices {n}, vocab ({cfg.vocab}) and batch "
                           f"({cfg.batch}) must be divisible by {n}")
    mesh = Mesh(np.array(devices), ("data",))
    vocab_sh, repl = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P())

    def by_path(tree):
        # The tied (and untied output) matrix and their optimizer moments are vocab-sharded.
        return jax.tree_util.tree_map_with_path(
            lambda path, x: vocab_sh if x.ndim == 2 and any(
                getattr(k, "key", None) in ("embed", "unembed") for k in path) else repl, tree)

    abstract_params = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    return by_path(abstract_params), by_path(abstract_opt), NamedSharding(mesh, P("data", None)), repl


# Every option of program(), checked by type and value before the program is built (one line each).
OPTIONS = opt.OptionTable("tied-embedding", (
    opt.Option("mode", opt.choice(*MODES), "which paths differentiate W"),
    opt.Option("remat", opt.boolean(), "each block under jax.checkpoint"),
    opt.Option("dtype", opt.choice(*DTYPES), "parameter dtype"),
    opt.Option("vocab", opt.integer(1), "vocabulary size V"),
    opt.Option("d_model", opt.integer(1), "model width D"),
    opt.Option("layers", opt.integer(1), "decoder layers"),
    opt.Option("heads", opt.integer(1), "attention heads"),
    opt.Option("seq", opt.integer(2), "sequence length of batch A"),
    opt.Option("batch", opt.integer(1), "batch size"),
    opt.Option("devices", opt.device_count_or_list(), "a device count or the devices"),
    opt.Option("learning_rate", opt.number(0), "Adam learning rate"),
    opt.Option("variant", opt.choice(*VARIANTS), "a workaround variant of the two uses of W"),
    opt.Option("precision", opt.choice(*PRECISIONS), "the dots' matmul precision (default, high, highest)"),
))


@OPTIONS.checked
def program(mode: str = "full", remat: bool = True, dtype: str = "f32", vocab: int = 256, d_model: int = 64,
            layers: int = 2, heads: int = 4, seq: int = 16, batch: int = 8, devices=1,
            learning_rate: float = 1e-3, variant: str = "baseline", precision: str = "default"):
    """The tied-embedding model as a TrainProgram: ``init``, ``batch`` and a plain optax Adam step;
    ``variant`` names a workaround of :mod:`xla_harness.programs.variants` (``baseline``: the model as
    written, compiled exactly as before the variants existed). ``devices``: a count (the first N of
    this backend's devices) or a list of devices (a compile target's). ``precision``: the dots'
    matmul precision (``default``: as written; ``high``, ``highest``: the step traced under
    ``jax.default_matmul_precision``)."""
    import optax

    from xla_harness.programs import variants
    from xla_harness.programs.interface import TrainProgram, step_from_loss

    cfg = ModelConfig(mode=mode, remat=bool(remat), dtype=dtype, vocab=int(vocab), d_model=int(d_model),
                      layers=int(layers), heads=int(heads), seq=int(seq), batch=int(batch), precision=precision)
    device_list = _device_list(devices) if not (isinstance(devices, int) and devices == 1) else None
    if not float(learning_rate) > 0:
        raise HarnessError("learning rate must be positive")
    optimizer = optax.adam(float(learning_rate))
    ops = None if variants.tied_ops(variant).name == "baseline" else variants.tied_ops(variant)
    step = with_matmul_precision(step_from_loss(lambda params, batches: loss_fn(params, batches, cfg, ops), optimizer),
                                 cfg.precision)

    def init_fn(key):
        params = init_params(cfg, key)
        return params, optimizer.init(params)

    def batch_fn(key):
        return make_batches(cfg, key)

    jit_kwargs: dict = {}
    if device_list is not None and len(device_list) > 1:
        p_sh, o_sh, b_sh, repl = _mesh_shardings(cfg, device_list, optimizer)
        init_jit = jax.jit(init_fn, out_shardings=(p_sh, o_sh))
        batch_jit = jax.jit(batch_fn, out_shardings=(b_sh, b_sh))
        jit_kwargs = {"in_shardings": (p_sh, o_sh, (b_sh, b_sh)),
                      "out_shardings": (p_sh, o_sh, {"loss": repl})}
    else:
        init_jit, batch_jit = jax.jit(init_fn), jax.jit(batch_fn)
    options = {**cfg.to_dict(), "devices": len(device_list) if device_list else 1,
               "learning_rate": float(learning_rate)}
    if ops is not None:
        options["variant"] = variant
    name = (f"tied-embedding {cfg.label()}" + ("" if cfg.precision == "default" else f"/precision={cfg.precision}")
            + (f"+{variant}" if ops is not None else ""))
    return TrainProgram(name=name, init=init_jit,
                        batch=lambda key, step_index: batch_jit(key), step=step, donate_argnums=(0, 1),
                        jit_kwargs=jit_kwargs, options=options, target_leaf="['embed']")
