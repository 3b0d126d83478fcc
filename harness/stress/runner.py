"""Stress runner: train the tied-embedding family step after step and count non-finite updates.

Per step, on device and fused into the training step: is the loss finite, is every
gradient leaf finite, is every update leaf finite, and max |update|. A non-finite step is
not applied (the parameters are kept, and the optimizer state too when the gradients are
non-finite), so every step is one Bernoulli trial of "does this compiled program produce a
non-finite update". The flags
stay on device and are fetched once per block of K steps, so the host never waits on a
step it does not have to.

Fault injection (``inject_nan_rate``) corrupts one element of the tied matrix's update,
on device, keyed by (seed, step): it exists to prove the detector and the statistics.
``reference`` recomputes a sample of steps in float64 on the CPU from the same state and
data and flags *silent* corruption: a finite update that is wrong beyond tolerance.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from harness.errors import HarnessError
from harness.programs.tied_embedding import (
    DTYPES,
    MODES,
    ModelConfig,
    init_params,
    loss_fn,
    make_batches,
)
from harness.stress import records
from harness.stress import store as results

RESULTS_NAME = "stress.jsonl"
# Relative tolerance of the float64 reference check, per parameter dtype (see reference_check).
REFERENCE_RTOL = {"f32": 2e-2, "bf16": 0.3}


@dataclass(frozen=True)
class StressSpec:
    """A stress matrix: every (mode, remat) configuration x every seed, ``steps`` steps each."""

    modes: tuple[str, ...] = MODES
    remats: tuple[bool, ...] = (True, False)
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    steps: int = 20
    dtype: str = "f32"
    devices: int = 1
    inject_nan_rate: float = 0.0
    reference: bool = False
    reference_every: int = 5
    block: int = 10
    learning_rate: float = 1e-3
    vocab: int = 256
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    seq: int = 16
    batch: int = 8

    def __post_init__(self) -> None:
        if not self.modes:
            raise HarnessError("no modes given")
        for m in self.modes:
            if m not in MODES:
                raise HarnessError(f"unknown mode {m!r}; expected one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            raise HarnessError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if not self.remats:
            raise HarnessError("no remat setting given")
        if not self.seeds:
            raise HarnessError("no seeds given")
        if len(set(self.seeds)) != len(self.seeds):
            raise HarnessError("seeds must be distinct")
        if any(s < 0 or s >= 2**31 for s in self.seeds):
            raise HarnessError("seeds must be integers in [0, 2**31)")
        for name in ("steps", "devices", "block", "reference_every"):
            if getattr(self, name) <= 0:
                raise HarnessError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not 0.0 <= self.inject_nan_rate <= 1.0:
            raise HarnessError(f"inject-nan-rate must be in [0, 1], got {self.inject_nan_rate}")
        if not self.learning_rate > 0:
            raise HarnessError("learning rate must be positive")
        self.configs()  # ModelConfig validates the sizes
        if self.devices > 1:
            if self.vocab % self.devices or self.batch % self.devices:
                raise HarnessError(f"with --devices {self.devices}, vocab ({self.vocab}) and batch "
                                   f"({self.batch}) must be divisible by {self.devices}")

    def configs(self) -> list[ModelConfig]:
        return [ModelConfig(mode=m, remat=r, dtype=self.dtype, vocab=self.vocab, d_model=self.d_model,
                            layers=self.layers, heads=self.heads, seq=self.seq, batch=self.batch)
                for m in self.modes for r in self.remats]

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> StressSpec:
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**d)


# ----------------------------------------------------------------------------- the step


def leaf_names(tree) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def step_keys(seed, step) -> tuple[jax.Array, jax.Array]:
    """(data key, fault key) of one step: a pure function of (seed, step)."""
    key = jax.random.fold_in(jax.random.key(seed), step)
    k_data, k_fault = jax.random.split(key)
    return k_data, k_fault


def fault_hit(k_fault: jax.Array, rate: float) -> jax.Array:
    return jax.random.uniform(jax.random.split(k_fault)[0]) < rate


def injected_steps(seed: int, steps: int, rate: float) -> np.ndarray:
    """The steps fault injection corrupts for (seed, rate): what a perfect detector reports."""
    hits = jax.vmap(lambda s: fault_hit(step_keys(seed, s)[1], rate))(jnp.arange(steps, dtype=jnp.int32))
    return np.flatnonzero(np.asarray(hits))


def inject_fault(updates: dict, key: jax.Array, rate: float) -> dict:
    """With probability ``rate`` (decided by ``key``), set one element of the tied matrix's
    update to NaN. Pure and on device."""
    k_idx = jax.random.split(key)[1]
    u = updates["embed"]
    hit = fault_hit(key, rate)
    idx = jax.random.randint(k_idx, (), 0, u.size)
    flat = u.reshape(-1)
    flat = flat.at[idx].set(jnp.where(hit, jnp.asarray(jnp.nan, u.dtype), flat[idx]))
    return {**updates, "embed": flat.reshape(u.shape)}


@dataclass
class StepFlags:
    """Per-step checks, computed on device."""

    loss: jax.Array
    loss_ok: jax.Array
    grads_ok: jax.Array  # bool[n_leaves]
    updates_ok: jax.Array  # bool[n_leaves]
    max_abs_update: jax.Array


jax.tree_util.register_dataclass(
    StepFlags, data_fields=["loss", "loss_ok", "grads_ok", "updates_ok", "max_abs_update"], meta_fields=[]
)


def _all_finite(tree) -> jax.Array:
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)])


def make_optimizer(learning_rate: float) -> optax.GradientTransformation:
    return optax.adam(learning_rate)


def step_body(cfg: ModelConfig, optimizer, *, inject_rate: float = 0.0, checked: bool = True,
              batch_sharding=None) -> Callable:
    """The training step as a pure function (params, opt_state, seed, step) -> (params, opt_state, flags).

    ``checked=False`` gives the bare step (no checks, update always applied) used as the
    benchmark baseline; everything else is identical.
    """

    def step(params, opt_state, seed, step_idx):
        k_data, k_fault = step_keys(seed, step_idx)
        batches = make_batches(cfg, k_data)
        if batch_sharding is not None:
            batches = tuple(jax.lax.with_sharding_constraint(b, batch_sharding) for b in batches)
        loss, grads = jax.value_and_grad(loss_fn)(params, batches, cfg)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        if inject_rate > 0.0:
            updates = inject_fault(updates, k_fault, inject_rate)
        if not checked:
            return optax.apply_updates(params, updates), new_opt, loss
        loss_ok = jnp.isfinite(loss)
        grads_ok = _all_finite(grads)
        updates_ok = _all_finite(updates)
        grads_fine = loss_ok & jnp.all(grads_ok)
        ok = grads_fine & jnp.all(updates_ok)
        applied = optax.apply_updates(params, updates)
        new_params = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), applied, params)
        # The optimizer state absorbs the gradients, so it is kept when they are non-finite;
        # gating it on the gradients alone lets XLA fuse the select into the moment updates.
        new_opt = jax.tree_util.tree_map(lambda n, o: jnp.where(grads_fine, n, o), new_opt, opt_state)
        max_abs = jnp.max(jnp.stack([jnp.max(jnp.abs(u)).astype(jnp.float32)
                                     for u in jax.tree_util.tree_leaves(updates)]))
        return new_params, new_opt, StepFlags(loss, loss_ok, grads_ok, updates_ok, max_abs)

    return step


@dataclass
class Program:
    """A compiled training step and the state it starts from."""

    cfg: ModelConfig
    step: Callable
    init: Callable[[int], tuple]
    names: list[str]
    shardings: tuple | None = None


def build_program(cfg: ModelConfig, spec: StressSpec, checked: bool = True) -> Program:
    """Jit the step (parameters and optimizer state donated, as a real training loop does)."""
    optimizer = make_optimizer(spec.learning_rate)
    mesh = None
    if spec.devices > 1:
        avail = jax.devices()
        if len(avail) < spec.devices:
            raise HarnessError(
                f"--devices {spec.devices} requested but only {len(avail)} {jax.default_backend()} "
                "device(s) are visible (on CPU the CLI sets --xla_force_host_platform_device_count)")
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh = Mesh(np.array(avail[: spec.devices]), ("data",))
        batch_sharding = NamedSharding(mesh, P("data", None))
        vocab_sharded = NamedSharding(mesh, P("data", None))
        replicated = NamedSharding(mesh, P())
    else:
        batch_sharding = None

    body = step_body(cfg, optimizer, inject_rate=spec.inject_nan_rate, checked=checked,
                     batch_sharding=batch_sharding)

    def init(seed: int):
        params = init_params(cfg, jax.random.key(seed))
        if mesh is not None:
            params = {k: jax.device_put(v, vocab_sharded if k in ("embed", "unembed") else replicated)
                      for k, v in params.items()}
        opt_state = jax.jit(optimizer.init)(params)
        if mesh is not None:  # scalars (the step count) land on one device: replicate them
            opt_state = jax.tree_util.tree_map(
                lambda x: x if len(x.sharding.device_set) == spec.devices else jax.device_put(x, replicated),
                opt_state)
        return params, opt_state

    if mesh is None:
        step = jax.jit(body, donate_argnums=(0, 1))
        shardings = None
    else:
        p0, o0 = init(0)
        shardings = jax.tree_util.tree_map(lambda x: x.sharding, (p0, o0))
        flag_sh = replicated
        step = jax.jit(body, donate_argnums=(0, 1),
                       in_shardings=(shardings[0], shardings[1], replicated, replicated),
                       out_shardings=(shardings[0], shardings[1], flag_sh if not checked else
                                      StepFlags(flag_sh, flag_sh, flag_sh, flag_sh, flag_sh)))
    names = leaf_names(init_params(cfg, jax.random.key(0)))
    return Program(cfg=cfg, step=step, init=init, names=names, shardings=shardings)


def compile_train_step(cfg: ModelConfig, devices: int = 1, **spec_overrides):
    """The checked training step compiled for the current backend (for HLO scanning)."""
    spec = StressSpec(modes=(cfg.mode,), remats=(cfg.remat,), dtype=cfg.dtype, devices=devices,
                      vocab=cfg.vocab, d_model=cfg.d_model, layers=cfg.layers, heads=cfg.heads,
                      seq=cfg.seq, batch=cfg.batch, **spec_overrides)
    prog = build_program(cfg, spec)
    params, opt_state = prog.init(0)
    return prog.step.lower(params, opt_state, np.uint32(0), np.int32(0)).compile()


# ----------------------------------------------------------------------------- reference


def _enable_x64():
    """Context manager enabling float64: ``jax.enable_x64`` (new) or the experimental one (jax <= 0.11)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


def _to64(x):
    """Floating leaves (bf16 included) to float64; integer leaves (step counts) unchanged."""
    a = np.asarray(x)
    if a.dtype == jnp.bfloat16 or np.issubdtype(a.dtype, np.floating):
        return jnp.asarray(a.astype(np.float64))
    return jnp.asarray(a)


def reference_check(cfg: ModelConfig, spec: StressSpec, seed: int, step: int, params_before,
                    opt_before, params_after, names: list[str]) -> dict:
    """Recompute one step in float64 on the CPU and compare the update the device applied.

    Per parameter leaf, the applied change d = p_after - p_before must match the float64
    update u (same state, same data) in the 2-norm: |d - u| <= rtol |u| + n**0.5 * ulp(p),
    where the ulp term allows for rounding of p + u in the parameter dtype.
    """
    cpu = jax.devices("cpu")[0]
    k_data, _ = step_keys(seed, step)
    with jax.default_device(cpu):
        batches = jax.device_get(jax.jit(lambda k: make_batches(cfg, k))(k_data))
        with _enable_x64():
            p64 = jax.tree_util.tree_map(_to64, params_before)
            o64 = jax.tree_util.tree_map(_to64, opt_before)
            b64 = tuple(jnp.asarray(b) for b in batches)
            loss, grads = jax.value_and_grad(loss_fn)(p64, b64, cfg)
            updates, _ = make_optimizer(spec.learning_rate).update(grads, o64, p64)
            u_leaves = [np.asarray(u) for u in jax.tree_util.tree_leaves(updates)]
    rtol = REFERENCE_RTOL[cfg.dtype]
    worst, worst_leaf = 0.0, None
    for name, u, pb, pa in zip(names, u_leaves, jax.tree_util.tree_leaves(params_before),
                               jax.tree_util.tree_leaves(params_after), strict=True):
        pb64, pa64 = np.asarray(pb, np.float64), np.asarray(pa, np.float64)
        d = pa64 - pb64
        ulp = float(np.max(np.abs(np.spacing(np.asarray(pa).astype(np.float32))))) if cfg.dtype == "f32" \
            else float(np.max(np.abs(pa64))) * 2.0**-7
        allowed = rtol * float(np.linalg.norm(u)) + math.sqrt(u.size) * ulp
        err = float(np.linalg.norm(d - u))
        ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else math.inf)
        if ratio > worst:
            worst, worst_leaf = ratio, name
    return {"step": step, "ok": bool(worst <= 1.0), "worst_ratio": worst, "worst_leaf": worst_leaf,
            "loss64": float(loss)}


# ----------------------------------------------------------------------------- the loop


@dataclass
class RunState:
    """Where one (config, seed) stands: next step to run and the device state."""

    next_step: int = 0
    params: object = None
    opt_state: object = None


def _checkpoint_path(out: Path, cfg: ModelConfig, seed: int) -> Path:
    safe = cfg.label().replace("/", "_").replace("=", "-")
    return out / "ckpt" / f"{safe}_seed{seed}.npz"


def save_checkpoint(path: Path, step: int, params, opt_state) -> None:
    """Atomically write (step, state) so --resume need not replay from step 0."""
    import os

    leaves = jax.tree_util.tree_leaves((params, opt_state))
    arrays = {f"a{i}": np.asarray(jax.device_get(x)) for i, x in enumerate(leaves)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    with open(tmp, "wb") as fh:
        np.savez(fh, step=np.int64(step), **{k: (v.view(np.uint16) if v.dtype == jnp.bfloat16 else v)
                                             for k, v in arrays.items()})
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, like) -> tuple[int, object] | None:
    """(step, state) from a checkpoint whose leaves match ``like``; None if absent or unusable."""
    try:
        with np.load(path) as z:
            step = int(z["step"])
            leaves, treedef = jax.tree_util.tree_flatten(like)
            out = []
            for i, ref in enumerate(leaves):
                a = z[f"a{i}"]
                if ref.dtype == jnp.bfloat16:
                    a = a.view(jnp.bfloat16)
                if a.shape != ref.shape:
                    return None
                sharding = getattr(ref, "sharding", None)
                out.append(jax.device_put(a.astype(ref.dtype), sharding))
            return step, jax.tree_util.tree_unflatten(treedef, out)
    except (OSError, KeyError, ValueError):
        return None


@dataclass
class BlockResult:
    cfg: ModelConfig
    seed: int
    start: int
    end: int
    records: list[dict] = field(default_factory=list)

    @property
    def nonfinite(self) -> int:
        return sum(not r["finite"] for r in self.records)

    @property
    def silent(self) -> int:
        return sum(1 for r in self.records if r.get("reference") and not r["reference"]["ok"])


def _first_bad(flags: dict, names: list[str]) -> str | None:
    if not flags["loss_ok"]:
        return "loss"
    for stage, key in (("grad", "grads_ok"), ("update", "updates_ok")):
        bad = [n for n, ok in zip(names, flags[key], strict=True) if not ok]
        if bad:
            return f"{stage}:{bad[0]}"
    return None


def _host_records(start: int, host_flags: list, names: list[str]) -> list[dict]:
    out = []
    for i, f in enumerate(host_flags):
        f = {"loss": float(f.loss), "loss_ok": bool(f.loss_ok), "grads_ok": [bool(x) for x in f.grads_ok],
             "updates_ok": [bool(x) for x in f.updates_ok], "max": float(f.max_abs_update)}
        first = _first_bad(f, names)
        out.append({
            "step": start + i,
            "finite": first is None,
            "first_bad": first,
            "max_abs_update": f["max"] if math.isfinite(f["max"]) else None,
            "loss": f["loss"] if math.isfinite(f["loss"]) else None,
        })
    return out


def run_config(prog: Program, seed: int, spec: StressSpec, state: RunState,
               should_stop: Callable[[], bool] = lambda: False) -> Iterator[BlockResult]:
    """Run steps [state.next_step, spec.steps) and yield one BlockResult per K steps.

    The device's flags are fetched once per block (one host sync). A stop request ends the
    current block early; the partial block is yielded so nothing that ran is lost.
    """
    seed_arr = np.uint32(seed)
    pending: list = []
    block_start = state.next_step
    refs: dict[int, dict] = {}
    for s in range(state.next_step, spec.steps):
        sample = spec.reference and s % spec.reference_every == 0
        if sample:
            before = jax.device_get((state.params, state.opt_state))
        state.params, state.opt_state, flags = prog.step(state.params, state.opt_state, seed_arr, np.int32(s))
        if sample:
            refs[s] = reference_check(prog.cfg, spec, seed, s, before[0], before[1],
                                      jax.device_get(state.params), prog.names)
        pending.append(flags)
        state.next_step = s + 1
        stop = should_stop()
        if len(pending) == spec.block or s == spec.steps - 1 or stop:
            records = _host_records(block_start, jax.device_get(pending), prog.names)
            for r in records:
                if r["step"] in refs:
                    ref = refs.pop(r["step"])
                    # A step whose update was rejected as non-finite was not applied: nothing to compare.
                    r["reference"] = ref if r["finite"] else {**ref, "ok": True, "skipped": "non-finite"}
            yield BlockResult(prog.cfg, seed, block_start, s + 1, records)
            pending, block_start = [], s + 1
            if stop:
                return


def block_line(b: BlockResult, env: dict) -> dict:
    return {
        "kind": "block",
        "config": b.cfg.to_dict(),
        "label": records.label(b.cfg.to_dict()),
        "seed": b.seed,
        "start": b.start,
        "end": b.end,
        "nonfinite": b.nonfinite,
        "silent": b.silent,
        "steps": b.records,
        "time": results.now(),
        "env": env,
    }


# ----------------------------------------------------------------------------- matrix


def completed_steps(blocks) -> dict[tuple[str, int], int]:
    """Per (label, seed): the number of consecutive steps from 0 already recorded."""
    ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for b in blocks:
        ranges.setdefault((b.label, b.seed), []).append((b.start, b.end))
    done = {}
    for key, rs in ranges.items():
        n = 0
        for a, e in sorted(rs):
            if a <= n:
                n = max(n, e)
        done[key] = n
    return done


class Progress:
    """One status line on stderr, rewritten in place on a terminal, printed per config otherwise."""

    def __init__(self, total_steps: int, enabled: bool = True):
        self.total = total_steps
        self.done = 0
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def update(self, b: BlockResult, nonfinite_so_far: int, config_done: bool) -> None:
        self.done += b.end - b.start
        if not self.enabled:
            return
        rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} steps "
                f"{b.cfg.label()} seed {b.seed} step {b.end}/{b.end if config_done else '…'} "
                f"non-finite {nonfinite_so_far} | {rate:.1f} steps/s")
        if self.tty:
            sys.stderr.write("\r" + line[:160].ljust(160))
            if self.done >= self.total:
                sys.stderr.write("\n")
        elif config_done:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self.done < self.total:
            sys.stderr.write("\n")


def run_matrix(spec: StressSpec, out: Path, resume: bool = False,
               should_stop: Callable[[], bool] = lambda: False, progress: bool = True,
               results_name: str = RESULTS_NAME) -> Path:
    """Run (or continue) the whole matrix, appending to ``out/results_name``. Returns the path."""
    out = Path(out)
    path = out / results_name
    with results.open_run(path, spec.to_dict(), resume=resume) as store:  # locked, checked, tail repaired
        done = completed_steps(store.blocks)
        env = results.environment()
        total = len(spec.configs()) * len(spec.seeds) * spec.steps
        bar = Progress(total, enabled=progress)
        bar.done = sum(min(v, spec.steps) for v in done.values())
        if store.header is None:
            store.write_header(spec.to_dict(), env)
        nonfinite = sum(b.nonfinite for b in store.blocks)
        for cfg in spec.configs():
            prog = None
            for seed in spec.seeds:
                start = done.get((cfg.label(), seed), 0)
                if start >= spec.steps:
                    continue
                if should_stop():
                    break
                prog = prog or build_program(cfg, spec)
                state = _initial_state(prog, out, seed, start, spec)
                for block in run_config(prog, seed, spec, state, should_stop):
                    store.append(block_line(block, env))
                    if jax.process_count() == 1:  # sharded state is not addressable from one host
                        save_checkpoint(_checkpoint_path(out, cfg, seed), block.end, state.params,
                                        state.opt_state)
                    nonfinite += block.nonfinite
                    bar.update(block, nonfinite, block.end == spec.steps)
            if should_stop():
                break
    bar.close()
    return path


def _initial_state(prog: Program, out: Path, seed: int, start: int, spec: StressSpec) -> RunState:
    """State at step ``start``: fresh at 0, else from the checkpoint, replaying any gap."""
    params, opt_state = prog.init(seed)
    state = RunState(0, params, opt_state)
    if start == 0:
        return state
    ck = load_checkpoint(_checkpoint_path(out, prog.cfg, seed), (params, opt_state)) \
        if jax.process_count() == 1 else None
    if ck is not None and ck[0] <= start:
        state.next_step, (state.params, state.opt_state) = ck[0], ck[1]
    # Replay steps the checkpoint does not cover (deterministic: same seed, same steps).
    replay = replace(spec, steps=start, reference=False, block=max(1, start))
    for _ in run_config(prog, seed, replay, state):
        pass
    return state


def bare_loop(prog: Program, seed: int, steps: int) -> None:
    """The same jitted step without checks (benchmark baseline); blocks at the end."""
    params, opt_state = prog.init(seed)
    loss = None
    for s in range(steps):
        params, opt_state, loss = prog.step(params, opt_state, np.uint32(seed), np.int32(s))
    jax.block_until_ready((params, loss))
