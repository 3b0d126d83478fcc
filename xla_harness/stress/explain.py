"""``stress --explain``: whose NaN each of a configuration's first failing steps is
(:func:`xla_harness.origin.classify.origin_of`), decided after the measurement from what the run holds.

The measured program is never changed: the state before a failing step is the one the run rebuilds
anyway to roll the step back (the block commit's recompute); it is copied to the host there, for at
most :attr:`ExplainSpec.max_steps` failing steps per configuration, into ``OUT/origins/`` (so a run
interrupted while explaining, or before, finishes its explanations with ``--resume``). The frozen
protocol's state before any step is its fixed inputs, regenerated from the seed. The batch is
regenerated from the step's key. A step's replays run the executable the run measured (the same
compiled object), from fresh device copies placed as the executable expects.

Each origin is one ``"kind": "origin"`` line of the results file
(:class:`~xla_harness.stress.results.records.StepOrigin`).
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
from typing import Any

import jax
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.names import DEFAULT_REPLAYS, EXPLAIN_MAX_STEPS
from xla_harness.origin.classify import (
    Origin,
    Replayed,
    checked_outputs,
    masking_flag,
    origin_of,
    replayed,
)
from xla_harness.origin.eager import Stopped, host, is_key_dtype
from xla_harness.stress.proof.harness import BlockResult, Harnessed, initial_state
from xla_harness.stress.results import provenance, records

ORIGINS_DIR = "origins"


@dataclass(frozen=True)
class ExplainSpec:
    """How many failing steps of each configuration get an origin, and how many replays each gets."""

    max_steps: int = EXPLAIN_MAX_STEPS
    replays: int = DEFAULT_REPLAYS


def _slug(label: str) -> str:
    digest = hashlib.sha1(label.encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label)[:60] + "-" + digest


def state_path(out: Path, label: str, seed: int, step: int) -> Path:
    return Path(out) / ORIGINS_DIR / _slug(label) / f"seed{seed}-step{step}.npz"


@dataclass(frozen=True)
class Kept:
    """A state on the host: each leaf's array (a typed PRNG key: its key data) with its dtype, weak
    type and key implementation, so that the leaves made from it (:meth:`arrays`) are the step's
    arguments as the run passed them, in buffers of their own every time (the step may donate them)."""

    treedef: Any
    leaves: tuple[np.ndarray, ...]
    meta: tuple[dict, ...]  # per leaf: {"dtype", "shape", "weak", ["key_impl"]}

    @classmethod
    def of(cls, tree) -> Kept:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        arrays, meta = [], []
        for x in leaves:
            key = is_key_dtype(getattr(x, "dtype", None))
            a = np.array(host(jax.device_get(x)), order="C")  # (ascontiguousarray would make a scalar 1-d)
            arrays.append(a)
            meta.append({"dtype": str(a.dtype), "shape": list(a.shape), "weak": bool(getattr(x, "weak_type", False)),
                         **({"key_impl": str(jax.random.key_impl(x))} if key else {})})
        return cls(treedef, tuple(arrays), tuple(meta))

    def arrays(self, shardings=None):
        """The tree as fresh jax arrays (weak types and keys restored), placed as ``shardings`` says
        (a tree of shardings, or None: the default device)."""
        from xla_harness.stress.loop.checkpoint import as_weak

        flat_shardings = jax.tree_util.tree_leaves(shardings) if shardings is not None else [None] * len(self.leaves)
        out = []
        for a, m, sh in zip(self.leaves, self.meta, flat_shardings, strict=True):
            x = jax.numpy.asarray(a) if sh is None else jax.device_put(a, sh)
            if m.get("key_impl"):
                x = jax.random.wrap_key_data(x, impl=m["key_impl"])
            elif m.get("weak"):
                x = as_weak(x)
            out.append(x)
        return jax.tree_util.tree_unflatten(self.treedef, out)


def save_state(path: Path, params, opt_state) -> None:
    """``(params, opt_state)`` as raw bytes per leaf with dtype, shape, weak type (bfloat16 included; a
    typed PRNG key as its key data and its implementation), written atomically (the partial file's
    name is not a kept state's)."""
    kept = Kept.of((params, opt_state))
    arrays = {f"leaf{i}": a.reshape(-1).view(np.uint8) for i, a in enumerate(kept.leaves)}
    arrays["meta"] = np.frombuffer(json.dumps(list(kept.meta)).encode(), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_state(path: Path, like) -> Kept:
    """The state :func:`save_state` wrote, in the tree structure of ``like`` (arrays or
    ``ShapeDtypeStruct``s), each leaf's dtype and shape checked against it; HarnessError naming the
    file when it is not such a state (cut short, another program's, not an archive at all)."""
    import jax.numpy as jnp

    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            leaves = [np.frombuffer(z[f"leaf{i}"].tobytes(), dtype=jnp.dtype(m["dtype"])).reshape(tuple(m["shape"]))
                      for i, m in enumerate(meta)]
            meta = [{"dtype": str(m["dtype"]), "shape": list(m["shape"]), "weak": bool(m.get("weak", False)),
                     **({"key_impl": str(m["key_impl"])} if m.get("key_impl") else {})} for m in meta]
    except Exception as exc:  # noqa: BLE001 - a zip cut short, a meta of another shape: all "not a state"
        raise HarnessError(f"{path}: not a saved state ({type(exc).__name__})") from None
    flat, treedef = jax.tree_util.tree_flatten(like)
    if len(flat) != len(leaves):
        raise HarnessError(f"{path}: {len(leaves)} leaves, the state has {len(flat)}")
    for i, (x, m) in enumerate(zip(flat, meta, strict=True)):
        want = tuple(getattr(x, "shape", ()))
        key = is_key_dtype(getattr(x, "dtype", None))
        if (not key and (want != tuple(m["shape"]) or str(x.dtype) != m["dtype"])) or key != bool(m.get("key_impl")):
            raise HarnessError(f"{path}: leaf {i} is {m['dtype']}{m['shape']}, the state's is "
                               f"{getattr(x, 'dtype', '?')}{list(want)}")
    return Kept(treedef, tuple(leaves), tuple(meta))


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
                 log: Callable[[str], None] = lambda line: None, frozen: bool = False,
                 seeds: tuple[int, ...] = ()) -> None:
        self.spec, self.out, self.log, self.frozen, self.seeds = spec, Path(out), log, frozen, tuple(seeds)
        self.not_kept: dict[tuple[str, int, int], str] = {}  # a state the keeper could not keep, and why
        self.done = {(o.label, o.seed, o.step) for o in done}
        self.failures: dict[str, list[Failure]] = {}
        for b in recorded:  # what an earlier run of a resumed one recorded
            for s in b.steps:
                self.note(b.label, b.seed, s.step, s.finite, s.injected is not None)

    def note_block(self, block: BlockResult) -> None:
        for r in block.records:
            self.note(block.label, block.seed, r.step, r.finite, r.injected is not None)

    # -- during the run

    def note(self, label: str, seed: int, step: int, finite: bool, injected: bool) -> None:
        """A step recorded (its first execution): failing ones are remembered; planted ones are not explained."""
        if finite or injected:
            return
        seen = self.failures.setdefault(label, [])
        if all((f.seed, f.step) != (seed, step) for f in seen):
            seen.append(Failure(seed, step))

    def chosen(self, label: str) -> list[Failure]:
        """The failing steps of ``label`` that get an origin: the first ``max_steps`` in the order they
        ran (seeds as the run took them, then steps) among those whose state before them is at hand
        (kept at their rollback, init's, the frozen inputs), then the others (they say why not); under
        the frozen protocol one per seed (its calls have the same inputs)."""
        order = {seed: i for i, seed in enumerate(self.seeds)}
        picked: list[Failure] = []
        for f in sorted(self.failures.get(label, []), key=lambda f: (order.get(f.seed, len(order)), f.seed, f.step)):
            if self.frozen and any(p.seed == f.seed for p in picked):
                continue
            picked.append(f)
        at_hand = [f for f in picked if self.frozen or f.step == 0 or state_path(self.out, label, f.seed, f.step)
                   .is_file() or (label, f.seed, f.step) in self.done]
        return (at_hand + [f for f in picked if f not in at_hand])[:self.spec.max_steps]

    def pending(self, label: str) -> bool:
        """Whether a failing step of ``label`` (of the first ``max_steps``) still lacks its origin."""
        return any((label, f.seed, f.step) not in self.done for f in self.chosen(label))

    def keeper(self, label: str) -> Callable[[int, int, records.Step, Callable[[], Any]], None]:
        """The block commit's hook at each failing step: ``(seed, step, record, before)``, ``before()``
        giving the state before ``step`` (rebuilt by the rollback, or from the block's restore point for a
        loss-only failure); a host copy is kept (``OUT/origins/``) while fewer than ``max_steps`` of the
        configuration's failures have one."""

        def keep(seed: int, step: int, record: records.Step, before: Callable[[], Any]) -> None:
            if record.injected or record.finite:
                return
            kept = [p for p in (self.out / ORIGINS_DIR / _slug(label)).glob("seed*-step*.npz")]
            path = state_path(self.out, label, seed, step)
            if path.is_file() or len(kept) >= self.spec.max_steps:
                return
            try:  # keeping it must never end the measurement
                state = before()
                if state is None:
                    self.not_kept[(label, seed, step)] = "the state before it could not be rebuilt"
                    return
                save_state(path, *state)
            except Exception as exc:  # noqa: BLE001 - a full disk, a state no host array holds: said later
                self.not_kept[(label, seed, step)] = f"{type(exc).__name__}: {str(exc)[:200]}"

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
                                     provenance.now())
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
        kept, batch = got
        replay = _replayer(h, kept, f.seed, f.step if h.spec.protocol == "train" else 0)
        folder = _program_folder(h.spec.program)
        try:
            return origin_of(h.program.step, kept.arrays(), batch, replay, replays=self.spec.replays,
                             user_folders=[folder] if folder else [], should_stop=should_stop,
                             masking=masking_flag())
        except Stopped:
            return None

    def _before(self, h: Harnessed, f: Failure) -> tuple[Kept, Any] | Origin:
        """(the state before the step, kept on the host; its batch), or the ``unknown`` origin saying
        why there is none."""
        if h.spec.protocol == "frozen":
            s = initial_state(h, f.seed)
            return Kept.of((s.params, s.opt_state)), s.batch
        path = state_path(self.out, h.label, f.seed, f.step)
        if f.step == 0 and not path.is_file():  # the state before the first step is init's
            s = initial_state(h, f.seed)
            return Kept.of((s.params, s.opt_state)), h.batch(f.seed, 0)
        if (h.label, f.seed, f.step) in self.not_kept:
            return Origin("unknown", f"not explained: the state before it could not be kept "
                                     f"({self.not_kept[(h.label, f.seed, f.step)]})", None, {"reason": "not-kept"})
        if not path.is_file():
            why = ("--commit step keeps no copy of the state before a failing step (the default --commit block does)"
                   if h.spec.commit == "step" else
                   "the state before it was not kept (kept only when the run that measured it had --explain, "
                   "and only at a rollback: not in a block run step by step, nor when its new state was finite)")
            return Origin("unknown", f"not explained: {why}", None, {"reason": "no-state"})
        return load_state(path, _state_shapes(h, f.seed)), h.batch(f.seed, f.step)


def _state_shapes(h: Harnessed, seed: int):
    """The state's leaves as ``ShapeDtypeStruct``s, from ``init`` traced (not run) and the step's own
    outputs (the state is what the step returns)."""
    from xla_harness.stress.proof.harness import call_user

    params, opt_state = call_user(h.spec, "init", jax.eval_shape, h.program.init, jax.random.key(seed))
    batch = call_user(h.spec, "batch", jax.eval_shape, h.program.batch, jax.random.key(seed), 0)
    returned = jax.eval_shape(h.program.step, params, opt_state, batch)
    return returned[0], returned[1]


def _program_folder(program: str) -> str | None:
    """The folder of a ``FILE.py:NAME`` program (the user's own lines are there), else None."""
    module_part = program.rsplit(":", 1)[0] if ":" in program else ""
    if module_part.endswith(".py") or "/" in module_part:
        return str(Path(module_part).resolve().parent)
    return None


def _replayer(h: Harnessed, state: Kept, seed: int, step: int) -> Callable[[], Replayed] | None:
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
        try:
            params, opt_state = state.arrays(shardings)
        except (ValueError, TypeError):  # shardings of another structure: the default device
            params, opt_state = state.arrays()
        out = h.call_step(params, opt_state, h.batch(seed, step))
        flat, _ = jax.tree_util.tree_flatten_with_path(out)
        checked = checked_outputs(out)
        leaves = [host(jax.device_get(x)) for _, x in flat]
        return replayed(leaves, checked, tuple(jax.tree_util.keystr(p) for p, _ in flat))

    return replay
