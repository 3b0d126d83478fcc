"""Stress runner: call a program's training step again and again and count non-finite steps.

The measured program is the user's step compiled as the user compiles it
(:meth:`TrainProgram.jit`: same donation, same shardings, nothing inserted). Everything the
harness adds runs in *separate* jitted functions over the step's inputs and outputs:

* a **checker** (is the loss finite, every new parameter leaf, every new optimizer-state
  leaf, ``aux["grads"]``/``aux["updates"]`` when the step exposes them; max |new - old|);
* **rollback** (protocol ``train``): the checker's commit keeps a copy of the last good
  parameters *and* optimizer state and puts it back after a non-finite step, so one event
  is one failure and every step is one Bernoulli trial;
* **fault injection** (``inject_rate``, keyed by (seed, step) and planned on the host):
  corrupts the step's *output* between calls and is recorded per step as ``injected``;
  NaN/inf kinds prove the detector, the finite kinds (a lost or doubled row of the target
  matrix's update) prove ``reference``.

Protocols: ``train`` runs a trajectory (new batch every step, donated state, rollback);
``frozen`` is the reporter's: identical params, optimizer state and batch on every call,
no donation, each call an independent trial. Flags stay on device and are fetched once per
block of K steps. ``reference`` recomputes sampled steps in float64 on the CPU and flags
finite-but-wrong updates per row of every matrix.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import TrainProgram, load_program, program_factory
from xla_harness.programs.tied_embedding import DTYPES, MODES, ModelConfig
from xla_harness.programs.variants import parse_variant, variant_program
from xla_harness.stress import records
from xla_harness.stress import store as results

RESULTS_NAME = "stress.jsonl"
BUILTIN = records.BUILTIN_PROGRAM
PROTOCOLS = ("train", "frozen")
INJECT_KINDS = ("nan", "inf-opt", "nan-opt", "lost-row", "doubled-row")
FINITE_KINDS = ("lost-row", "doubled-row")
# Relative tolerance of the float64 reference check per floating dtype: whole leaf (2-norm) and per row.
REFERENCE_RTOL = {"float32": 2e-2, "bfloat16": 0.3, "float16": 0.1, "float64": 1e-6}
ROW_RTOL = {"float32": 0.5, "bfloat16": 0.75, "float16": 0.6, "float64": 1e-3}


@dataclass(frozen=True)
class StressSpec:
    """A stress matrix: every configuration x every seed, ``steps`` calls each.

    With the built-in program the configurations are (mode x remat) of the tied-embedding
    model at the given sizes; any other ``program`` is one configuration built with
    ``program_options``. ``variants`` (workaround variants and compiler-flag sets of
    :mod:`xla_harness.programs.variants`, ``baseline`` first) multiply every configuration: each
    is compiled separately and its rows are compared with the baseline's.
    """

    modes: tuple[str, ...] = MODES
    remats: tuple[bool, ...] = (True, False)
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    steps: int = 20
    dtype: str = "f32"
    devices: int = 1
    inject_rate: float = 0.0
    inject: str = "nan"
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
    program: str = BUILTIN
    program_options: tuple[tuple[str, object], ...] = ()
    protocol: str = "train"
    checkpoint_seconds: float = 300.0
    variants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._check_matrix()
        self._check_variants()
        for name in ("steps", "devices", "block", "reference_every"):
            if getattr(self, name) <= 0:
                raise HarnessError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not 0.0 <= self.inject_rate <= 1.0:
            raise HarnessError(f"inject-rate must be in [0, 1], got {self.inject_rate}")
        for name, value, allowed in (("injection", self.inject, INJECT_KINDS),
                                     ("protocol", self.protocol, PROTOCOLS)):
            if value not in allowed:
                raise HarnessError(f"unknown {name} {value!r}; expected one of {', '.join(allowed)}")
        if not self.learning_rate > 0:
            raise HarnessError("learning rate must be positive")
        if self.program == BUILTIN:
            for opts in self.configs():
                ModelConfig(**{k: v for k, v in opts.items() if k not in ("devices", "learning_rate", "variant")})
            if self.devices > 1 and (self.vocab % self.devices or self.batch % self.devices):
                raise HarnessError(f"with --devices {self.devices}, vocab ({self.vocab}) and batch "
                                   f"({self.batch}) must be divisible by {self.devices}")

    def _check_matrix(self) -> None:
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

    def _check_variants(self) -> None:
        if not self.variants:
            return
        if len(set(self.variants)) != len(self.variants):
            raise HarnessError("variants must be distinct")
        if self.variants[0] != "baseline":
            raise HarnessError("the variants list must start with baseline (every variant is compared with it), "
                               f"got {','.join(self.variants)}")
        for name in self.variants:
            parse_variant(name)
        if "variant" in dict(self.program_options):
            raise HarnessError("--program-option variant=... and --variants exclude each other")

    def configs(self) -> list[dict]:
        """The program options of every configuration of the matrix (with ``variant`` in a
        variants run: the name :func:`build` applies)."""
        if self.program != BUILTIN:
            base = [dict(self.program_options)]
        else:
            base = [{"mode": m, "remat": r, "dtype": self.dtype, "vocab": self.vocab, "d_model": self.d_model,
                     "layers": self.layers, "heads": self.heads, "seq": self.seq, "batch": self.batch,
                     "devices": self.devices, "learning_rate": self.learning_rate}
                    for m in self.modes for r in self.remats]
        if not self.variants:
            return base
        return [{**c, "variant": v} for c in base for v in self.variants]

    def label(self, options: dict) -> str:
        """The row label of one configuration (the built-in's ``mode/remat=../dtype``)."""
        return records.label(options, self.program)

    def labels(self) -> list[str]:
        return [self.label(o) for o in self.configs()]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["program_options"] = dict(self.program_options)
        if not self.variants:  # results written before variants existed keep their spec
            del d["variants"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> StressSpec:
        d = dict(d)
        d["program_options"] = tuple(sorted((d.get("program_options") or {}).items()))
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**d)


def build(spec: StressSpec, options: dict) -> TrainProgram:
    """The TrainProgram of one configuration (under its ``variant``, if it names one)."""
    if not spec.variants:
        return load_program(spec.program, **options)
    rest = {k: v for k, v in options.items() if k != "variant"}
    return variant_program(program_factory(spec.program), options["variant"], **rest)


# ----------------------------------------------------------------------------- keys and injection


def leaf_names(tree) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@jax.jit
def _step_keys(seed, step):
    key = jax.random.fold_in(jax.random.key(seed), step)
    k_data, k_fault = jax.random.split(key)
    return k_data, k_fault


def step_keys(seed, step) -> tuple[jax.Array, jax.Array]:
    """(data key, fault key) of one step: a pure function of (seed, step)."""
    return _step_keys(np.uint32(seed), np.int32(step))


def injected_steps(seed: int, steps: int, rate: float) -> np.ndarray:
    """The steps fault injection corrupts for (seed, rate): what a perfect detector reports."""
    if rate <= 0.0:
        return np.zeros(0, np.int64)
    hits = jax.vmap(lambda s: jax.random.uniform(
        jax.random.split(jax.random.fold_in(jax.random.key(seed), s))[1]) < rate)(
        jnp.arange(steps, dtype=jnp.int32))
    return np.flatnonzero(np.asarray(hits))


def _floating(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype, jnp.floating)


def target_index(params, target_leaf: str | None) -> int:
    """Index (in tree_leaves order) of the parameter leaf faults are injected into."""
    names = leaf_names(params)
    leaves = jax.tree_util.tree_leaves(params)
    if target_leaf is not None:
        if target_leaf not in names:
            raise HarnessError(f"target leaf {target_leaf} is not a parameter (have {', '.join(names[:8])}...)")
        return names.index(target_leaf)
    floats = [i for i, x in enumerate(leaves) if _floating(x)]
    if not floats:
        raise HarnessError("the program has no floating-point parameter to inject faults into")
    return max(floats, key=lambda i: leaves[i].size)


def opt_target_index(opt_state, like) -> int:
    """The last optimizer-state leaf shaped like the target parameter (Adam's second moment)."""
    cands = [i for i, x in enumerate(jax.tree_util.tree_leaves(opt_state))
             if _floating(x) and x.shape == like.shape]
    if not cands:
        raise HarnessError("no optimizer-state leaf has the target parameter's shape; "
                           "nan-opt/inf-opt injection needs one")
    return cands[-1]


def make_injector(kind: str, p_index: int, o_index: int | None) -> Callable:
    """jit(old_params, new_params, new_opt, key) -> (new_params, new_opt), one leaf corrupted."""

    def corrupt_element(x, key, value):
        flat = x.reshape(-1)
        idx = jax.random.randint(key, (), 0, flat.size)
        return flat.at[idx].set(jnp.asarray(value, x.dtype)).reshape(x.shape)

    def inject(old_params, new_params, new_opt, key):
        p_leaves, p_def = jax.tree_util.tree_flatten(new_params)
        o_leaves, o_def = jax.tree_util.tree_flatten(new_opt)
        if kind == "nan":
            p_leaves[p_index] = corrupt_element(p_leaves[p_index], key, jnp.nan)
        elif kind in ("nan-opt", "inf-opt"):
            o_leaves[o_index] = corrupt_element(o_leaves[o_index], key, jnp.nan if kind == "nan-opt" else jnp.inf)
        else:  # a lost or doubled row of the target matrix's update (finite, wrong)
            new, old = p_leaves[p_index], jax.tree_util.tree_leaves(old_params)[p_index]
            rows = new.reshape(new.shape[0], -1) if new.ndim else new.reshape(1, 1)
            upd = rows.astype(jnp.float32) - (old.reshape(rows.shape)).astype(jnp.float32)
            moved = jnp.any(upd != 0, axis=1)
            r = jnp.argmax(jnp.where(moved, jax.random.uniform(key, moved.shape), -1.0))
            fixed = old.reshape(rows.shape)[r] if kind == "lost-row" else (rows[r] + upd[r]).astype(new.dtype)
            p_leaves[p_index] = rows.at[r].set(fixed).reshape(new.shape)
        return jax.tree_util.tree_unflatten(p_def, p_leaves), jax.tree_util.tree_unflatten(o_def, o_leaves)

    return jax.jit(inject, donate_argnums=(1, 2))


# ----------------------------------------------------------------------------- the outside checker


def _finite_per_leaf(tree) -> jax.Array:
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if _floating(x)]
    if not leaves:
        return jnp.ones((0,), bool)
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def _max_abs_change(old, new) -> jax.Array:
    vals = [jnp.max(jnp.abs(n.astype(jnp.float32) - o.astype(jnp.float32))) if n.size else jnp.float32(0)
            for o, n in zip(jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new), strict=True)
            if _floating(n)]
    return jnp.max(jnp.stack(vals)) if vals else jnp.float32(0)


def _flags(old_params, new_params, new_opt, aux) -> dict:
    loss = jnp.asarray(aux["loss"]).astype(jnp.float32)
    flags = {
        "loss": loss,
        "loss_ok": jnp.all(jnp.isfinite(loss)),
        "params_ok": _finite_per_leaf(new_params),
        "opt_ok": _finite_per_leaf(new_opt),
        "max_abs_update": _max_abs_change(old_params, new_params),
    }
    for extra in ("grads", "updates"):
        if extra in aux:
            flags[f"{extra}_ok"] = _finite_per_leaf(aux[extra])
    ok = flags["loss_ok"]
    for k, v in flags.items():
        if k.endswith("_ok") and k != "loss_ok":
            ok = ok & jnp.all(v)
    flags["ok"] = ok
    return flags


def make_checker() -> Callable:
    """jit(old_params, new_params, new_opt, aux) -> flags (frozen protocol: outputs are discarded)."""
    return jax.jit(_flags)


def make_commit() -> Callable:
    """jit(backup_p, backup_o, new_p, new_o, aux) -> (flags, next_p, next_o, backup_p', backup_o').

    Train protocol: the next state is the step's output when it is finite, else the backup
    (rollback of params *and* optimizer state); the new backup is a separate copy of it.
    """

    def commit(backup_p, backup_o, new_p, new_o, aux):
        flags = _flags(backup_p, new_p, new_o, aux)
        ok = flags["ok"]
        nxt = jax.tree_util.tree_map(lambda n, b: jnp.where(ok, n, b), (new_p, new_o), (backup_p, backup_o))
        copy = jax.tree_util.tree_map(lambda x: x + jnp.zeros((), x.dtype) if _floating(x) else x * 1, nxt)
        return flags, nxt[0], nxt[1], copy[0], copy[1]

    return jax.jit(commit, donate_argnums=(0, 1, 2, 3))


@jax.jit
def _copy(tree):
    """A copy of a pytree in new buffers (the rollback backup)."""
    return jax.tree_util.tree_map(lambda x: x + jnp.zeros((), x.dtype) if _floating(x) else x * 1, tree)


# ----------------------------------------------------------------------------- fingerprint


_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")


_DEBUG_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def normalise_hlo_text(text: str) -> str:
    """HLO text without what only says where it was traced from: the module name, op metadata
    and the source-location tables (they hold the caller's line, which differs per call site)."""
    first, _, rest = text.partition("\n")
    header = re.sub(r"^HloModule [^ ,]+", "HloModule m", first)
    blocks = [b for b in rest.split("\n\n") if b.strip().split("\n", 1)[0].strip() not in _DEBUG_TABLES]
    return header + "\n" + _METADATA.sub("", "\n\n".join(blocks))


def _alias_config(header: str) -> str:
    """The ``input_output_alias={...}`` of an HloModule line (balanced braces), or ''."""
    start = header.find("input_output_alias={")
    if start < 0:
        return ""
    i = depth = start + len("input_output_alias=")
    depth = 0
    for j in range(i, len(header)):
        depth += {"{": 1, "}": -1}.get(header[j], 0)
        if depth == 0:
            return header[i + 1:j].strip()
    return header[i + 1:].strip()


def fingerprint(compiled) -> dict:
    """What identifies a compiled step: its optimized HLO (normalised by :func:`normalise_hlo_text`),
    the input/output aliasing XLA chose and the sizes of its buffers."""
    text = compiled.as_text()
    body = normalise_hlo_text(text)
    out = {"hlo_sha256": hashlib.sha256(body.encode()).hexdigest(),
           "input_output_alias": _alias_config(text.partition("\n")[0]),
           "instructions": body.count(" = ")}
    try:
        mem = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend reports it
        mem = None
    for name in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes"):
        out[name] = int(getattr(mem, name, -1)) if mem is not None else -1
    out["id"] = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]
    return out


def plain_jit(program: TrainProgram, donate_argnums: tuple[int, ...]):
    """The step as a user jits it by hand: ``jax.jit(step, donate_argnums=..., **jit_kwargs)``."""
    return jax.jit(program.step, donate_argnums=donate_argnums, **program.jit_kwargs)


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


def _ulp(pa: np.ndarray) -> np.ndarray:
    """Per-element spacing of the parameter dtype at the applied value (rounding of p + u)."""
    if pa.dtype == jnp.bfloat16:
        return np.abs(pa.astype(np.float64)) * 2.0**-7 + np.finfo(np.float32).tiny
    return np.abs(np.spacing(pa.astype(np.promote_types(pa.dtype, np.float32)))).astype(np.float64)


def compare_update(name: str, before: np.ndarray, after: np.ndarray, u: np.ndarray, chunk_rows: int = 8192) -> dict:
    """Does the applied change d = after - before match the float64 update u?

    Whole leaf: |d - u| <= rtol |u| + ||ulp||. Per row (first axis of a matrix): the same
    with the row's own norms and ROW_RTOL, so one lost or doubled row of a 100k-row matrix
    is an error of 100% of that row, not 1/sqrt(100k) of the leaf. Rows are processed in
    chunks, so a 100k x 2048 matrix needs a few chunk-sized float64 temporaries, not copies of it.
    """
    after = np.asarray(after)
    dt = str(after.dtype)
    rtol, row_rtol = REFERENCE_RTOL.get(dt, 2e-2), ROW_RTOL.get(dt, 0.5)
    shape = after.shape
    rows = shape[0] if len(shape) >= 2 else 1
    b2, a2, u2 = (np.asarray(x).reshape(rows, -1) for x in (before, after, np.asarray(u).reshape(shape)))
    err_sq = u_sq = ulp_sq = 0.0
    worst_row, row_ratio = None, 0.0
    for lo in range(0, rows, chunk_rows):
        a = a2[lo:lo + chunk_rows]
        d = a.astype(np.float64) - b2[lo:lo + chunk_rows].astype(np.float64)
        uc = u2[lo:lo + chunk_rows].astype(np.float64)
        ulp = _ulp(a)
        e_r = np.sum((d - uc) ** 2, axis=1)
        u_r = np.sum(uc * uc, axis=1)
        l_r = np.sum(ulp * ulp, axis=1)
        err_sq, u_sq, ulp_sq = err_sq + e_r.sum(), u_sq + u_r.sum(), ulp_sq + l_r.sum()
        if len(shape) >= 2:
            allowed = row_rtol * np.sqrt(u_r) + np.sqrt(l_r)
            e = np.sqrt(e_r)
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(allowed > 0, e / np.where(allowed > 0, allowed, 1.0), np.where(e > 0, np.inf, 0.0))
            i = int(np.argmax(r))
            if worst_row is None or r[i] > row_ratio:
                worst_row, row_ratio = lo + i, float(r[i])
    allowed = rtol * math.sqrt(u_sq) + math.sqrt(ulp_sq)
    err = math.sqrt(err_sq)
    leaf_ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else math.inf)
    return {"leaf": name, "ratio": max(leaf_ratio, row_ratio), "leaf_ratio": leaf_ratio, "row_ratio": row_ratio,
            "row": worst_row}


def reference_check(program: TrainProgram, params_before, opt_before, batch, params_after) -> dict:
    """Recompute one step in float64 on the CPU (same state, same batch) and compare per leaf and row."""
    cpu = jax.devices("cpu")[0]
    names = leaf_names(params_before)
    with jax.default_device(cpu), _enable_x64():
        p64 = jax.tree_util.tree_map(_to64, params_before)
        o64 = jax.tree_util.tree_map(_to64, opt_before)
        b64 = jax.tree_util.tree_map(jnp.asarray, batch)
        ref_p, _, aux = jax.jit(program.step)(p64, o64, b64)
        u_leaves = [np.asarray(r) - np.asarray(p) for r, p in zip(
            jax.tree_util.tree_leaves(ref_p), jax.tree_util.tree_leaves(p64), strict=True)]
        loss64 = float(np.asarray(aux["loss"]))
    worst = {"ratio": 0.0, "leaf": None, "row": None}
    for name, u, pb, pa in zip(names, u_leaves, jax.tree_util.tree_leaves(params_before),
                               jax.tree_util.tree_leaves(params_after), strict=True):
        if not np.issubdtype(np.asarray(pa).dtype, np.floating) and np.asarray(pa).dtype != jnp.bfloat16:
            continue
        c = compare_update(name, np.asarray(pb), np.asarray(pa), u)
        if c["ratio"] > worst["ratio"]:
            worst = c
    return {"ok": bool(worst["ratio"] <= 1.0), "worst_ratio": worst["ratio"], "worst_leaf": worst["leaf"],
            "worst_row": worst["row"], "loss64": loss64}


# ----------------------------------------------------------------------------- one configuration


@dataclass
class Harnessed:
    """A program with the harness's outside functions, compiled once per configuration."""

    program: TrainProgram
    spec: StressSpec
    label: str
    options: dict
    step: Callable  # the user's step, jitted as the user jits it
    checker: Callable
    commit: Callable
    names: list[str]
    opt_names: list[str]
    p_index: int
    o_index: int | None
    fingerprint: dict | None = None
    _injector: Callable | None = None

    @property
    def donate(self) -> tuple[int, ...]:
        return () if self.spec.protocol == "frozen" else tuple(self.program.donate_argnums)

    def injector(self) -> Callable:
        if self._injector is None:
            self._injector = make_injector(self.spec.inject, self.p_index, self.o_index)
        return self._injector


def prepare(spec: StressSpec, options: dict, program: TrainProgram | None = None) -> Harnessed:
    program = program or build(spec, options)
    if spec.protocol == "frozen":
        program = replace(program, donate_argnums=())
    params, opt_state = jax.eval_shape(program.init, jax.random.key(0))
    p_index = target_index(params, program.target_leaf)
    o_index = None
    if spec.inject in ("nan-opt", "inf-opt") and spec.inject_rate > 0:
        o_index = opt_target_index(opt_state, jax.tree_util.tree_leaves(params)[p_index])
    return Harnessed(program, spec, spec.label(options), options, program.jit(), make_checker(), make_commit(),
                     _float_names(params), _float_names(opt_state), p_index, o_index)


def _float_names(tree) -> list[str]:
    return [n for n, x in zip(leaf_names(tree), jax.tree_util.tree_leaves(tree), strict=True) if _floating(x)]


def check_same_program(h: Harnessed, params, opt_state, batch) -> dict:
    """Fingerprint the step the harness runs and a plain ``jax.jit(step)`` of it; they must be equal."""
    ours = fingerprint(h.step.lower(params, opt_state, batch).compile())
    plain = fingerprint(plain_jit(h.program, h.donate).lower(params, opt_state, batch).compile())
    if ours != plain:
        diff = [k for k in ours if ours[k] != plain.get(k)]
        raise HarnessError(f"{h.label}: the step the harness runs differs from a plain jax.jit of it "
                           f"({', '.join(diff)}: {ours[diff[0]]!r} vs {plain[diff[0]]!r}); refusing to measure "
                           "a different program")
    h.fingerprint = ours
    return ours


@dataclass
class RunState:
    """Where one (config, seed) stands: next step, device state and (train) its backup copy."""

    next_step: int = 0
    params: object = None
    opt_state: object = None
    backup: tuple | None = None
    batch: object = None  # frozen protocol: the one batch every call gets


@dataclass
class BlockResult:
    label: str
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

    @property
    def injected(self) -> int:
        return sum(1 for r in self.records if r.get("injected"))


def _first_bad(f: dict, h: Harnessed) -> str | None:
    if not f["loss_ok"]:
        return "loss"
    for key, stage, names in (("grads_ok", "grad", h.names), ("updates_ok", "update", h.names),
                              ("params_ok", "param", h.names), ("opt_ok", "opt", h.opt_names)):
        if key in f:
            bad = [n for n, ok in zip(names, f[key], strict=False) if not ok]
            if bad or not all(f[key]):
                return f"{stage}:{bad[0] if bad else '?'}"
    return None


def _host_records(start: int, host_flags: list, h: Harnessed, planned: set[int]) -> list[dict]:
    out = []
    for i, f in enumerate(host_flags):
        first = None if bool(f["ok"]) else (_first_bad(f, h) or "?")
        mx, loss = float(f["max_abs_update"]), float(f["loss"])
        rec = {"step": start + i, "finite": first is None, "first_bad": first,
               "max_abs_update": mx if math.isfinite(mx) else None, "loss": loss if math.isfinite(loss) else None}
        if start + i in planned:
            rec["injected"] = h.spec.inject
        out.append(rec)
    return out


def initial_state(h: Harnessed, seed: int) -> RunState:
    params, opt_state = h.program.init(jax.random.key(seed))
    state = RunState(0, params, opt_state)
    if h.spec.protocol == "frozen":
        state.batch = h.program.batch(step_keys(seed, 0)[0], 0)
    else:
        state.backup = _copy((params, opt_state))
    return state


def run_config(h: Harnessed, seed: int, state: RunState, steps: int | None = None,
               should_stop: Callable[[], bool] = lambda: False) -> Iterator[BlockResult]:
    """Run steps [state.next_step, steps) and yield one BlockResult per block of K steps.

    The flags are fetched once per block (one host sync). A stop request ends the current
    block early; the partial block is yielded so nothing that ran is lost.
    """
    spec = h.spec
    steps = spec.steps if steps is None else steps
    planned = set(injected_steps(seed, steps, spec.inject_rate).tolist())
    frozen = spec.protocol == "frozen"
    pending: list = []
    block_start = state.next_step
    refs: dict[int, dict] = {}
    for s in range(state.next_step, steps):
        k_data, k_fault = step_keys(seed, s)
        batch = state.batch if frozen else h.program.batch(k_data, s)
        sample = spec.reference and s % spec.reference_every == 0
        if sample:
            before = jax.device_get((state.params, state.opt_state, batch))
        new_p, new_o, aux = h.step(state.params, state.opt_state, batch)
        if s in planned:
            old_p = state.params if frozen else state.backup[0]
            new_p, new_o = h.injector()(old_p, new_p, new_o, k_fault)
        if sample:
            refs[s] = reference_check(h.program, before[0], before[1], before[2], jax.device_get(new_p))
        if frozen:
            flags = h.checker(state.params, new_p, new_o, aux)
        else:
            flags, state.params, state.opt_state, bp, bo = h.commit(state.backup[0], state.backup[1],
                                                                    new_p, new_o, aux)
            state.backup = (bp, bo)
        pending.append(flags)
        state.next_step = s + 1
        stop = should_stop()
        if len(pending) == spec.block or s == steps - 1 or stop:
            records = _host_records(block_start, jax.device_get(pending), h, planned)
            for r in records:
                if r["step"] in refs:
                    ref = refs.pop(r["step"])
                    # A rejected (non-finite) step was not applied: nothing to compare.
                    r["reference"] = ref if r["finite"] else {**ref, "ok": True, "skipped": "non-finite"}
            yield BlockResult(h.label, seed, block_start, s + 1, records)
            pending, block_start = [], s + 1
            if stop:
                return


def block_line(b: BlockResult, h: Harnessed, env: dict) -> dict:
    return {
        "kind": "block",
        "config": h.options,
        "label": b.label,
        "program": h.spec.program,
        "protocol": h.spec.protocol,
        "seed": b.seed,
        "start": b.start,
        "end": b.end,
        "nonfinite": b.nonfinite,
        "silent": b.silent,
        "injected": b.injected,
        "steps": b.records,
        "fingerprint": h.fingerprint,
        "donate_argnums": list(h.donate),
        "time": results.now(),
        "env": env,
    }


# ----------------------------------------------------------------------------- checkpoints


def _checkpoint_path(out: Path, label: str, seed: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label.replace("=", "-"))
    return out / "ckpt" / f"{safe}_seed{seed}.npz"


def save_checkpoint(path: Path, step: int, params, opt_state) -> None:
    """Atomically write (step, state) so --resume need not replay from step 0."""
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


# ----------------------------------------------------------------------------- matrix


def completed_steps(blocks: list[records.Block]) -> dict[tuple[str, int], int]:
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


@dataclass
class Event:
    """What a progress callback gets after every block (and once per configuration compiled)."""

    kind: str  # "compiled" | "block"
    label: str
    seed: int = 0
    done_steps: int = 0
    total_steps: int = 0
    nonfinite: int = 0
    config_done: bool = False
    fingerprint: dict | None = None
    block: BlockResult | None = None


def _resume_state(h: Harnessed, out: Path, seed: int, start: int) -> RunState:
    """State at step ``start``: fresh at 0, else from the checkpoint, replaying any gap (train)."""
    state = initial_state(h, seed)
    if start == 0:
        return state
    if h.spec.protocol == "frozen":  # the inputs never change
        state.next_step = start
        return state
    ck = load_checkpoint(_checkpoint_path(out, h.label, seed), (state.params, state.opt_state)) \
        if jax.process_count() == 1 else None
    if ck is not None and ck[0] <= start:
        state.next_step, (state.params, state.opt_state) = ck[0], ck[1]
        state.backup = _copy((state.params, state.opt_state))
    # Replay steps the checkpoint does not cover (deterministic: same seed, same steps).
    quiet = replace(h, spec=replace(h.spec, reference=False, block=max(1, start)))
    for _ in run_config(quiet, seed, state, steps=start):
        pass
    return state


def run_seed(h: Harnessed, seed: int, state: RunState, store, out: Path, env: dict,
             should_stop: Callable[[], bool] = lambda: False) -> Iterator[BlockResult]:
    """Run one (config, seed) to its end: every block appended to the store (flushed, fsynced);
    train protocol: a checkpoint for --resume every ``checkpoint_seconds`` and when stopped early
    (a finished seed needs none)."""
    last_save = time.monotonic()
    for block in run_config(h, seed, state, should_stop=should_stop):
        store.append(block_line(block, h, env))
        unfinished = block.end < h.spec.steps
        due = should_stop() or time.monotonic() - last_save >= h.spec.checkpoint_seconds
        if h.spec.protocol == "train" and jax.process_count() == 1 and unfinished and due:
            save_checkpoint(_checkpoint_path(out, h.label, seed), block.end, state.params, state.opt_state)
            last_save = time.monotonic()
        yield block


def run_matrix(spec: StressSpec, out: Path, resume: bool = False,
               should_stop: Callable[[], bool] = lambda: False,
               on_event: Callable[[Event], None] | None = None,
               results_name: str = RESULTS_NAME) -> Path:
    """Run (or continue) the whole matrix, appending to ``out/results_name``. Returns the path.

    Before a configuration runs, the step the harness will call is fingerprinted against a
    plain ``jax.jit`` of the user's step (HarnessError if they differ).
    """
    out = Path(out)
    path = out / results_name
    programs = [build(spec, options) for options in spec.configs()]  # bad --program: no results file
    # Locked, header and options checked, every line validated, torn tail repaired.
    with results.open_run(path, spec.to_dict(), resume=resume) as store:
        done = completed_steps(store.blocks)
        env = results.environment()
        total = len(spec.configs()) * len(spec.seeds) * spec.steps
        done_steps = sum(min(v, spec.steps) for v in done.values())
        nonfinite = sum(b.nonfinite for b in store.blocks)
        emit = on_event or (lambda e: None)
        if store.header is None:
            store.write_header(spec.to_dict(), env)
        for options, program in zip(spec.configs(), programs, strict=True):
            label = spec.label(options)
            h = None
            for seed in spec.seeds:
                start = done.get((label, seed), 0)
                if start >= spec.steps or should_stop():
                    continue
                if h is None:
                    h = prepare(spec, options, program)
                state = _resume_state(h, out, seed, start)
                if h.fingerprint is None:
                    batch = state.batch if state.batch is not None else h.program.batch(step_keys(seed, 0)[0], 0)
                    fp = check_same_program(h, state.params, state.opt_state, batch)
                    emit(Event("compiled", label, seed, done_steps, total, nonfinite,
                               fingerprint={**fp, "donate_argnums": list(h.donate)}))
                for block in run_seed(h, seed, state, store, out, env, should_stop):
                    nonfinite += block.nonfinite
                    done_steps += block.end - block.start
                    emit(Event("block", label, seed, done_steps, total, nonfinite, block.end == spec.steps,
                               block=block))
            if should_stop():
                break
    return path


def compile_train_step(options: dict | None = None, program: str = BUILTIN, protocol: str = "train"):
    """The program's step exactly as the harness runs it, compiled on the current backend (for scanning)."""
    options = dict(options or {})
    spec = StressSpec(program=program, protocol=protocol, program_options=tuple(sorted(options.items())))
    h = prepare(spec, options)
    state = initial_state(h, 0)
    batch = state.batch if state.batch is not None else h.program.batch(step_keys(0, 0)[0], 0)
    return h.step.lower(state.params, state.opt_state, batch).compile()
