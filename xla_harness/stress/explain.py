"""``stress --explain``: whose NaN each of a configuration's first failing steps is
(:func:`xla_harness.origin.classify.origin_of`), decided after the measurement from what the run holds.

The measured program is never changed: the state before a failing step is the one the run rebuilds
anyway to roll the step back (the block commit's recompute); it is copied to the host there, for at
most :attr:`ExplainSpec.max_steps` failing steps per configuration, into ``OUT/origins/`` (so a run
interrupted while explaining, or before, finishes its explanations with ``--resume``). The frozen
protocol's state before any step is its fixed inputs, regenerated from the seed. The batch is
regenerated from the step's key. A step's replays run the executable the run measured (the same
compiled object), from fresh device copies placed as the executable expects.

Each origin is one ``"kind": "origin"`` line of the results file (:class:`~xla_harness.stress.records.StepOrigin`).
Steps corrupted by ``--inject`` are planted, not classified.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.origin.classify import DEFAULT_REPLAYS, Origin, Replayed, checked_outputs, masking_flag, origin_of
from xla_harness.origin.eager import Stopped, host, inexact, is_key_dtype
from xla_harness.stress import records
from xla_harness.stress import store as results
from xla_harness.stress.harness import BlockResult, Harnessed, initial_state

ORIGINS_DIR = "origins"
DEFAULT_MAX_STEPS = 3


@dataclass(frozen=True)
class ExplainSpec:
    """How many failing steps of each configuration get an origin, and how many replays each gets."""

    max_steps: int = DEFAULT_MAX_STEPS
    replays: int = DEFAULT_REPLAYS


def _slug(label: str) -> str:
    digest = hashlib.sha1(label.encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label)[:60] + "-" + digest


def state_path(out: Path, label: str, seed: int, step: int) -> Path:
    return Path(out) / ORIGINS_DIR / _slug(label) / f"seed{seed}-step{step}.npz"


def save_state(path: Path, params, opt_state) -> None:
    """``(params, opt_state)`` as raw bytes per leaf with dtype and shape (bfloat16 included; a typed
    PRNG key as its key data and its implementation), written atomically."""
    leaves = jax.tree_util.tree_leaves((params, opt_state))
    arrays, meta = {}, []
    for i, x in enumerate(leaves):
        impl = str(jax.random.key_impl(x)) if is_key_dtype(getattr(x, "dtype", None)) else None
        a = np.array(host(jax.device_get(x)), order="C")  # (ascontiguousarray would make a scalar 1-d)
        arrays[f"leaf{i}"] = a.reshape(-1).view(np.uint8)
        meta.append({"dtype": str(a.dtype), "shape": list(a.shape), **({"key_impl": impl} if impl else {})})
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_state(path: Path, like) -> tuple:
    """The state :func:`save_state` wrote, as host arrays in the tree structure of ``like``."""
    import jax.numpy as jnp

    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            leaves = [_leaf(np.frombuffer(z[f"leaf{i}"].tobytes(), dtype=jnp.dtype(m["dtype"])).reshape(
                tuple(m["shape"])), m.get("key_impl")) for i, m in enumerate(meta)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise HarnessError(f"{path}: not a saved state ({type(exc).__name__})") from None
    treedef = jax.tree_util.tree_structure(like)
    want = len(jax.tree_util.tree_leaves(like))
    if want != len(leaves):
        raise HarnessError(f"{path}: {len(leaves)} leaves, the state has {want}")
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _leaf(data: np.ndarray, key_impl: str | None):
    """A saved leaf: the array, or the typed PRNG key its key data and implementation make."""
    return data if key_impl is None else jax.random.wrap_key_data(jax.numpy.asarray(data), impl=key_impl)


@dataclass
class Failure:
    """A failing step of one configuration: its first execution, from a finite state, non-finite."""

    seed: int
    step: int


class Explainer:
    """One stress run's explanations: which failing steps get an origin, the states kept for them,
    and the classification after each configuration's seeds have run."""

    def __init__(self, spec: ExplainSpec, out: Path, done: list[records.StepOrigin],
                 recorded: list[records.Block] = (),  # type: ignore[assignment]
                 log: Callable[[str], None] = lambda line: None, frozen: bool = False) -> None:
        self.spec, self.out, self.log, self.frozen = spec, Path(out), log, frozen
        self.done = {(o.label, o.seed, o.step) for o in done}
        self.failures: dict[str, list[Failure]] = {}
        self.planted: dict[str, set[tuple[int, int]]] = {}
        for b in recorded:  # what an earlier run of a resumed one recorded
            for s in b.steps:
                self.note(b.label, b.seed, s.step, s.finite, s.injected is not None)

    def note_block(self, block: BlockResult) -> None:
        for r in block.records:
            self.note(block.label, block.seed, r["step"], r["finite"], bool(r.get("injected")))

    # -- during the run

    def note(self, label: str, seed: int, step: int, finite: bool, injected: bool) -> None:
        """A step recorded (its first execution): failing ones are remembered, planted ones set apart."""
        if finite:
            return
        if injected:
            self.planted.setdefault(label, set()).add((seed, step))
            return
        seen = self.failures.setdefault(label, [])
        if all((f.seed, f.step) != (seed, step) for f in seen):
            seen.append(Failure(seed, step))

    def chosen(self, label: str) -> list[Failure]:
        """The failing steps of ``label`` that get an origin: the first ``max_steps`` (by seed, then
        step); under the frozen protocol the first of each seed only (its calls have the same inputs)."""
        picked: list[Failure] = []
        for f in sorted(self.failures.get(label, []), key=lambda f: (f.seed, f.step)):
            if self.frozen and any(p.seed == f.seed for p in picked):
                continue
            picked.append(f)
        return picked[:self.spec.max_steps]

    def pending(self, label: str) -> bool:
        """Whether a failing step of ``label`` (of the first ``max_steps``) still lacks its origin."""
        return any((label, f.seed, f.step) not in self.done for f in self.chosen(label))

    def keeper(self, label: str) -> Callable[[int, int, dict, object, object], None]:
        """The block commit's hook at a rollback: ``(seed, step, record, params, opt_state)``, the state
        before ``step`` rebuilt; a host copy is kept (``OUT/origins/``) while fewer than ``max_steps``
        of the configuration's failures have one."""

        def keep(seed: int, step: int, record: dict, params, opt_state) -> None:
            if record.get("injected") or record.get("finite", True):
                return
            kept = [p for p in (self.out / ORIGINS_DIR / _slug(label)).glob("seed*-step*.npz")]
            path = state_path(self.out, label, seed, step)
            if path.is_file() or len(kept) >= self.spec.max_steps:
                return
            save_state(path, params, opt_state)

        return keep

    # -- after the configuration's seeds

    def explain(self, h: Harnessed, append: Callable[[dict], None],
                should_stop: Callable[[], bool] = lambda: False) -> list[records.StepOrigin]:
        """Classify the chosen failing steps of ``h``'s configuration that have no origin yet; each
        origin is appended (``append``: the run's results sink) as soon as it is decided."""
        made = []
        chosen = [f for f in self.chosen(h.label) if (h.label, f.seed, f.step) not in self.done]
        for i, f in enumerate(chosen):
            if should_stop():
                break
            self.log(f"explaining {h.label} seed {f.seed} step {f.step} ({i + 1} of {len(chosen)}): input, "
                     f"{self.spec.replays} replays, op by op in float32 and float64 (about two eager steps)")
            t = time.perf_counter()
            origin = self._origin(h, f, should_stop)
            if origin is None:
                self.log(f"  step {f.step}: stopped before its origin was decided (--resume decides it)")
                break
            rec = records.StepOrigin(h.label, f.seed, f.step, origin, round(time.perf_counter() - t, 3),
                                     results.now())
            append(rec.to_json())
            self.done.add((h.label, f.seed, f.step))
            made.append(rec)
            self.log(f"  step {f.step}: {origin.cls} ({rec.seconds:.1f} s): {origin.summary}")
        return made

    def _origin(self, h: Harnessed, f: Failure, should_stop: Callable[[], bool]) -> Origin | None:
        """The step's origin; None when a stop request came first (the step is left for --resume). What
        the user's ``init`` or ``batch`` raises making the step's inputs again, or a kept state that
        cannot be read, is an ``unknown`` origin saying so (the measurement stands)."""
        try:
            got = self._before(h, f)
        except HarnessError as exc:
            return Origin("unknown", f"not explained: {exc}", None, {"reason": "inputs-failed", "error": str(exc)})
        if isinstance(got, Origin):
            return got
        state, batch = got
        replay = _replayer(h, state, f.seed, f.step if h.spec.protocol == "train" else 0)
        folder = _program_folder(h.spec.program)
        try:
            return origin_of(h.program.step, state, batch, replay, replays=self.spec.replays,
                             user_folders=[folder] if folder else [], should_stop=should_stop,
                             masking=masking_flag())
        except Stopped:
            return None

    def _before(self, h: Harnessed, f: Failure) -> tuple[tuple, object] | Origin:
        """(state before the step, its batch) as host arrays, or the ``unknown`` origin saying why not."""
        if h.spec.protocol == "frozen":
            s = initial_state(h, f.seed)
            return _host((s.params, s.opt_state)), _host(s.batch)
        path = state_path(self.out, h.label, f.seed, f.step)
        if f.step == 0 and not path.is_file():  # the state before the first step is init's
            s = initial_state(h, f.seed)
            return _host((s.params, s.opt_state)), _host(h.batch(f.seed, 0))
        if not path.is_file():
            why = ("--commit step keeps no copy of the state before a failing step (the default --commit block does)"
                   if h.spec.commit == "step" else
                   "the state before it was not kept (kept only when the run that measured it had --explain, "
                   "and only at a rollback: not in a block run step by step, nor when its new state was finite)")
            return Origin("unknown", f"not explained: {why}", None, {"reason": "no-state"})
        like = initial_state(h, f.seed)
        state = load_state(path, (like.params, like.opt_state))
        return state, _host(h.batch(f.seed, f.step))


def _host(tree):
    """Host copies of ``tree``'s arrays; typed PRNG keys stay jax arrays (no numpy array holds one)."""
    return jax.tree_util.tree_map(lambda x: x if is_key_dtype(getattr(x, "dtype", None))
                                  else np.asarray(jax.device_get(x)), tree)


def _fresh(tree):
    """``tree`` with each typed PRNG key copied into a new buffer (host arrays are copied by device_put)."""
    def copy(x):
        if not is_key_dtype(getattr(x, "dtype", None)):
            return x
        return jax.random.wrap_key_data(jax.numpy.array(jax.random.key_data(x)), impl=jax.random.key_impl(x))

    return jax.tree_util.tree_map(copy, tree)


def _program_folder(program: str) -> str | None:
    """The folder of a ``FILE.py:NAME`` program (the user's own lines are there), else None."""
    module_part = program.rsplit(":", 1)[0] if ":" in program else ""
    if module_part.endswith(".py") or "/" in module_part:
        return str(Path(module_part).resolve().parent)
    return None


def _replayer(h: Harnessed, state: tuple, seed: int, step: int) -> Callable[[], Replayed] | None:
    """One replay of the step as the run called it (``h.call_step``: the executable it measured for
    that argument signature) from fresh device copies of ``state``, placed with the executable's own
    input shardings, and the step's batch made again by the user's ``batch`` (as the run made it)."""
    proven = h.proven
    if proven is None or proven.current is None:
        return None
    try:
        shardings = tuple(proven.current.input_shardings[0])[:2]
    except (AttributeError, IndexError, TypeError):
        shardings = None

    def replay() -> Replayed:
        fresh = _fresh(state)  # the step may donate what it is given: every replay gets buffers of its own
        placed = jax.device_put(fresh, shardings) if shardings is not None else jax.device_put(fresh)
        out = h.call_step(placed[0], placed[1], h.batch(seed, step))
        flat, _ = jax.tree_util.tree_flatten_with_path(out)
        checked = checked_outputs(out)
        leaves = [host(jax.device_get(x)) for _, x in flat]
        finite = all(bool(np.isfinite(a).all()) for a, c in zip(leaves, checked, strict=True)
                     if c and inexact(a.dtype))
        return Replayed(finite, tuple(hashlib.sha1(a.tobytes()).hexdigest() for a in leaves),
                        tuple(jax.tree_util.keystr(p) for p, _ in flat))

    return replay
