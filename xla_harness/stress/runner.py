"""Stress runner: call a program's training step again and again and count non-finite steps.

The measured program is the user's step compiled as the user compiles it
(:meth:`TrainProgram.jit`: same donation, same shardings, nothing inserted). Everything the
harness adds runs in *separate* jitted functions over the step's inputs and outputs:

* **checks** (is the loss finite, every new parameter and optimizer-state leaf,
  ``aux["grads"]``/``aux["updates"]`` when the step exposes them);
* **commit** (protocol ``train``): ``block`` (default) feeds the step's outputs straight back,
  keeps per step only the loss, and per block of K steps checks the state once and keeps one
  host snapshot; a block holding a non-finite step is restored and replayed with ``step``,
  which checks every step and rolls a non-finite one back (params *and* optimizer state) to a
  copy kept on device, so one event is one failure and every step is one Bernoulli trial;
  both give the same records, counts and trajectory;
* **fault injection** (``inject_rate``, keyed by (seed, step) and planned on the host):
  corrupts the step's *output* between calls and is recorded per step as ``injected``;
  NaN/inf kinds prove the detector, the finite kinds (a lost or doubled row of the target
  matrix's update) prove ``reference``;
* **nondeterminism**: frozen compares every call's outputs bitwise with the seed's first finite
  call's, train a replayed block's losses with its first run's (``nondet``).

Protocols: ``train`` runs a trajectory (new batch every step, donated state); ``frozen`` is the
reporter's: identical params, optimizer state and batch on every call, no donation, each call a
trial of that input. Flags stay on device and are fetched once per block. ``reference``
recomputes steps in float64 on the CPU and flags finite-but-wrong updates per row of every matrix.

The pieces live beside this module: :mod:`~xla_harness.stress.spec` (the matrix),
:mod:`~xla_harness.stress.inject`, :mod:`~xla_harness.stress.checker`,
:mod:`~xla_harness.stress.fingerprint`, :mod:`~xla_harness.stress.reference`,
:mod:`~xla_harness.stress.checkpoint`, :mod:`~xla_harness.stress.snapshot`; this module runs one
configuration and the matrix.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import TrainProgram, guard_user_error
from xla_harness.stress import records
from xla_harness.stress import store as results
from xla_harness.stress.checker import _copy, make_checker, make_commit, make_repeat_check, make_state_check
from xla_harness.stress.checkpoint import _checkpoint_path, load_checkpoint, save_checkpoint
from xla_harness.stress.fingerprint import fingerprint, plain_jit
from xla_harness.stress.inject import (
    _floating,
    injected_steps,
    leaf_names,
    make_injector,
    opt_target_index,
    step_keys,
    target_index,
)
from xla_harness.stress.reference import reference_check
from xla_harness.stress.snapshot import HostSnapshot
from xla_harness.stress.spec import BUILTIN, StressSpec, build

RESULTS_NAME = "stress.jsonl"


# ----------------------------------------------------------------------------- one configuration


@dataclass
class Harnessed:
    """A program with the harness's outside functions, compiled once per configuration."""

    program: TrainProgram
    spec: StressSpec
    label: str
    options: dict
    step: jax.stages.Wrapped  # the user's step, jitted as the user jits it
    checker: Callable
    commit: Callable
    names: list[str]
    opt_names: list[str]
    p_index: int
    o_index: int | None
    fingerprint: dict | None = None
    _injector: Callable | None = None
    state_check: Callable = field(default_factory=make_state_check)
    repeat_check: Callable = field(default_factory=make_repeat_check)
    snapshot: HostSnapshot = field(default_factory=HostSnapshot)  # block commit: host buffers, reused by every seed
    block_size: BlockSize | None = None  # block commit: K, carried from seed to seed

    @property
    def donate(self) -> tuple[int, ...]:
        return () if self.spec.protocol == "frozen" else tuple(self.program.donate_argnums)

    def injector(self) -> Callable:
        if self._injector is None:
            self._injector = make_injector(self.spec.inject, self.p_index, self.o_index)
        return self._injector


def _user(spec: StressSpec, what: str, fn: Callable, *args):
    """Call the user's ``init``/``batch``/``step`` (or trace it): whatever it raises, SystemExit and
    BaseException subclasses included, is one HarnessError naming the program and the function;
    KeyboardInterrupt stays an interrupt."""
    try:
        return fn(*args)
    except BaseException as e:  # noqa: BLE001 - the user's code: one error line, never a traceback or an exit
        raise guard_user_error(e, spec.program, what) from e


def _init_shapes(spec: StressSpec, program: TrainProgram, key) -> tuple:
    out = _user(spec, "init", jax.eval_shape, program.init, key)
    if not isinstance(out, tuple | list) or len(out) != 2:
        got = f"a {len(out)}-tuple" if isinstance(out, tuple | list) else type(out).__name__
        raise HarnessError(f"--program {spec.program}: init returned {got}; expected (params, opt_state)")
    return tuple(out)


def check_step_outputs(h: Harnessed, params, opt_state, batch) -> None:
    """The structure of what the user's step returns, from ``jax.eval_shape`` (nothing runs, nothing is
    compiled, the measured program is unchanged): ``(params, opt_state, aux)``, the first two shaped
    like the inputs, ``aux`` a mapping holding a scalar ``"loss"``."""
    where = f"--program {h.spec.program}: step"
    out = _user(h.spec, "step", jax.eval_shape, h.step, params, opt_state, batch)
    if not isinstance(out, tuple | list):
        raise HarnessError(f"{where} returned {type(out).__name__}; expected (params, opt_state, aux)")
    if len(out) != 3:
        raise HarnessError(f"{where} returned a {len(out)}-tuple; expected (params, opt_state, aux)")
    new_p, new_o, aux = out
    for name, new, old in (("params", new_p, params), ("opt_state", new_o, opt_state)):
        new_leaves, new_tree = jax.tree_util.tree_flatten(new)
        old_leaves, old_tree = jax.tree_util.tree_flatten(old)
        if str(new_tree) != str(old_tree):
            raise HarnessError(f"{where} returned {name} whose structure differs from its input's "
                               f"({len(new_leaves)} leaves vs {len(old_leaves)}); expected the updated {name}")
        for path, (n, o) in zip(jax.tree_util.tree_flatten_with_path(new)[0],
                                zip(new_leaves, old_leaves, strict=True), strict=True):
            if (jnp.shape(n), jnp.result_type(n)) != (jnp.shape(o), jnp.result_type(o)):
                raise HarnessError(f"{where} changed {name}{jax.tree_util.keystr(path[0])} from "
                                   f"{jnp.result_type(o)}{list(jnp.shape(o))} to {jnp.result_type(n)}"
                                   f"{list(jnp.shape(n))}; the step must keep each leaf's dtype and shape")
    if not isinstance(aux, Mapping):
        raise HarnessError(f"{where} returned aux of type {type(aux).__name__}; expected a mapping holding a "
                           "scalar 'loss'")
    if "loss" not in aux:
        raise HarnessError(f"{where} returned aux without 'loss' (keys: {', '.join(map(str, aux)) or 'none'}); "
                           "expected a mapping holding a scalar 'loss'")
    shape = getattr(aux["loss"], "shape", None)
    if shape != ():
        raise HarnessError(f"{where} returned aux['loss'] of shape {shape}; expected a scalar")


def prepare(spec: StressSpec, options: dict, program: TrainProgram | None = None) -> Harnessed:
    program = program or build(spec, options)
    if spec.protocol == "frozen":
        program = replace(program, donate_argnums=())
    params, opt_state = _init_shapes(spec, program, jax.random.key(0))
    p_index = target_index(params, program.target_leaf)
    o_index = None
    if spec.inject in ("nan-opt", "inf-opt") and spec.inject_rate > 0:
        o_index = opt_target_index(opt_state, jax.tree_util.tree_leaves(params)[p_index])
    return Harnessed(program, spec, spec.label(options), options, program.jit(), make_checker(), make_commit(),
                     _float_names(params), _float_names(opt_state), p_index, o_index)


def _float_names(tree) -> list[str]:
    return [n for n, x in zip(leaf_names(tree), jax.tree_util.tree_leaves(tree), strict=True) if _floating(x)]


def check_same_program(h: Harnessed, params, opt_state, batch, resumed: bool = False) -> dict:
    """The step the harness runs, on the arguments it will call it with, against a plain loop's first
    step compiled independently: a fresh ``jax.jit(step, donate_argnums=..., **jit_kwargs)`` of the
    user's step, traced and compiled after ``jax.clear_caches()`` (nothing shared with the harness's
    compile), on the arguments a plain loop has (``init``'s and ``batch``'s outputs, abstract). Equal
    HLO, aliasing and buffer sizes, or HarnessError naming the first difference: a harness that changed
    an argument's dtype, weak type, sharding or committedness, or the donation, fails here. A run
    ``resumed`` from a checkpoint is compared with a plain loop's later step (its arguments: what the
    step returned). Later steps are held to the step's own outputs by :func:`check_fed_back`."""
    from xla_harness.targets.compile import abstract_arguments

    ours = fingerprint(h.step.lower(params, opt_state, batch).compile())
    jax.clear_caches()
    plain_args = abstract_arguments(h.program, jax.devices(), h.spec.program, place_unplaced=False)
    step = plain_jit(h.program, h.donate)
    if resumed:  # a plain loop at a later step feeds what the step returned
        new_p, new_o, _ = jax.eval_shape(step, *plain_args)
        plain_args = (new_p, new_o, plain_args[2])
    plain = fingerprint(step.lower(*plain_args).compile())
    if ours != plain:
        diff = [k for k in ours if ours[k] != plain.get(k)]
        raise HarnessError(f"{h.label}: the step the harness runs differs from a plain loop's jax.jit of it "
                           f"({', '.join(diff)}: {ours[diff[0]]!r} vs {plain[diff[0]]!r}); refusing to measure "
                           "a different program")
    h.fingerprint = ours
    return ours


def leaf_signature(x) -> tuple:
    """What decides which program a jitted step compiles for an argument leaf: shape, dtype, weak
    type, sharding and layout (where the array reports one)."""
    layout = getattr(x, "format", None) or getattr(x, "layout", None)
    return (tuple(jnp.shape(x)), str(jnp.result_type(x)), bool(getattr(x, "weak_type", False)),
            repr(getattr(x, "sharding", None)), repr(layout))


_SIGNATURE_PARTS = ("shape", "dtype", "weak type", "sharding", "layout")


class _abstract:  # noqa: N801 - stands for a leaf: its signature, taken before the commit donates it
    def __init__(self, x) -> None:
        self.signature = leaf_signature(x)


def check_fed_back(h: Harnessed, fed, returned) -> None:
    """The state the harness feeds to the next step has the signature of what the step returned,
    leaf by leaf: what a plain loop (``params, opt = step(params, opt, batch)``) feeds. A difference
    (a weakly typed leaf made strong by a copy, a dtype, a sharding, a layout) would make the next
    call compile another program: refused, naming the leaf."""
    fed_leaves = jax.tree_util.tree_flatten_with_path(fed)[0]
    ret_leaves = jax.tree_util.tree_leaves(returned)
    for (path, a), b in zip(fed_leaves, ret_leaves, strict=True):
        sa, sb = leaf_signature(a), b.signature if isinstance(b, _abstract) else leaf_signature(b)
        if sa != sb:
            i = next(i for i in range(len(sa)) if sa[i] != sb[i])
            raise HarnessError(f"{h.label}: the harness would feed {jax.tree_util.keystr(path)} back with "
                               f"{_SIGNATURE_PARTS[i]} {sa[i]} where the step returned {sb[i]}; the next call "
                               "would compile a different program from a plain loop's: refusing to measure it")


@dataclass
class RunState:
    """Where one (config, seed) stands: next step, device state and (train) its backup copy."""

    next_step: int = 0
    params: object = None
    opt_state: object = None
    backup: tuple | None = None  # train, per-step commit: the last good state, in buffers of its own
    batch: object = None  # frozen protocol: the one batch every call gets
    first: object = None  # frozen: the outputs of the seed's first finite call (on device)
    first_ok: object = None  # frozen: whether ``first`` is a finite call's yet (a device flag)


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
        if bool(f.get("nondet", False)):
            rec["nondet"] = True
        out.append(rec)
    return out


def initial_state(h: Harnessed, seed: int) -> RunState:
    params, opt_state = _user(h.spec, "init", h.program.init, jax.random.key(seed))
    state = RunState(0, params, opt_state)
    if h.spec.protocol == "frozen":
        state.batch = first_batch(h, seed)
    return state


def first_batch(h: Harnessed, seed: int):
    """The user's batch of step 0 of ``seed`` (guarded like every call of the user's code)."""
    return _user(h.spec, "batch", h.program.batch, step_keys(seed, 0)[0], 0)


def _backup(state: RunState) -> tuple:
    """The train protocol's copy of the last good (params, opt_state), made by initial_state."""
    if state.backup is None:
        raise HarnessError("internal: a per-step train state without its backup copy (run_config makes it)")
    return state.backup


def run_config(h: Harnessed, seed: int, state: RunState, steps: int | None = None,
               should_stop: Callable[[], bool] = lambda: False) -> Iterator[BlockResult]:
    """Run steps [state.next_step, steps) and yield one BlockResult per block of steps.

    Train protocol, ``commit="block"`` (the default): :func:`_run_blocks`, the step's outputs fed
    straight back, one check and one host snapshot per block, a failing block replayed step by step.
    ``commit="step"`` and the frozen protocol: :func:`_run_steps`, every step checked (and in train
    rolled back) as it comes. A stop request ends the current block early; the partial block is
    yielded so nothing that ran is lost.
    """
    spec = h.spec
    steps = spec.steps if steps is None else steps
    planned = set(injected_steps(seed, steps, spec.inject_rate).tolist())
    if spec.protocol == "train" and spec.commit == "block":
        yield from _run_blocks(h, seed, state, steps, planned, should_stop)
        return
    if spec.protocol == "train" and state.backup is None:
        state.backup = _copy((state.params, state.opt_state))
    yield from _run_steps(h, seed, state, steps, planned, should_stop, spec.block or DEFAULT_SYNC)


DEFAULT_SYNC = 10  # steps per host sync of the per-step protocols when --block is not given


def _run_steps(h: Harnessed, seed: int, state: RunState, steps: int, planned: set[int],
               should_stop: Callable[[], bool], sync: int) -> Iterator[BlockResult]:
    """Every step checked as it runs: train commits it (rollback of a non-finite step to the backup
    copy), frozen checks it and compares its outputs bitwise with the seed's first finite call's
    (``nondet``). The flags stay on device and are fetched once per ``sync`` steps."""
    spec = h.spec
    frozen = spec.protocol == "frozen"
    pending: list = []
    block_start = first_checked = state.next_step
    refs: dict[int, dict] = {}
    for s in range(state.next_step, steps):
        k_data, k_fault = step_keys(seed, s)
        batch = state.batch if frozen else _user(spec, "batch", h.program.batch, k_data, s)
        sample = spec.reference and s % spec.reference_every == 0
        if sample:
            before = jax.device_get((state.params, state.opt_state, batch))
        new_p, new_o, aux = _user(spec, "step", h.step, state.params, state.opt_state, batch)
        if s in planned:
            old_p = state.params if frozen else _backup(state)[0]
            new_p, new_o = h.injector()(old_p, new_p, new_o, k_fault)
        if sample:
            refs[s] = reference_check(h.program, before[0], before[1], before[2], jax.device_get(new_p))
        if frozen:
            flags = dict(h.checker(state.params, new_p, new_o, aux))
            if state.first is None:
                state.first, state.first_ok = (new_p, new_o, aux), flags["ok"]
                flags["nondet"] = jnp.bool_(False)
            else:
                flags["nondet"], state.first, state.first_ok = h.repeat_check(
                    state.first, state.first_ok, (new_p, new_o, aux), flags["ok"])
        else:
            backup_p, backup_o = _backup(state)
            # The first two feedbacks of each run (the backup starts from init), then the first of each sync.
            watched = s <= first_checked + 1 or s == block_start
            returned = jax.tree_util.tree_map(_abstract, (new_p, new_o)) if watched else None
            flags, state.params, state.opt_state, bp, bo = h.commit(backup_p, backup_o, new_p, new_o, aux)
            state.backup = (bp, bo)
            if returned is not None:
                check_fed_back(h, (state.params, state.opt_state), returned)
        pending.append(flags)
        state.next_step = s + 1
        stop = should_stop()
        if len(pending) == sync or s == steps - 1 or stop:
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


@dataclass
class BlockSize:
    """How many steps the block protocol runs between two checks: ``fixed`` (``--block K``) or chosen
    from what the run observes. A block costs one host snapshot and one state check, ``c`` steps'
    worth of time; a block holding a failure costs its replay, about K more steps. Per step that is
    c/K + r*K at failure rate r: K = ceil(c / TARGET) keeps the checks under TARGET of the step's time,
    and once failures are seen K is held at sqrt(c / r), the minimum of the sum. K never grows more
    than 4x from one block to the next (one slow snapshot does not make the next block huge)."""

    fixed: int | None = None
    size: int = 10
    steps: int = 0
    failures: int = 0

    TARGET = 0.01
    LIMIT = 1000

    def __post_init__(self) -> None:
        if self.fixed:
            self.size = self.fixed

    def update(self, ran: int, failed: int, step_seconds: float, check_seconds: float) -> None:
        self.steps += ran
        self.failures += failed
        if self.fixed or ran <= 0 or step_seconds <= 0:
            return
        cost = check_seconds / (step_seconds / ran)  # one block's checks, in steps
        k = math.ceil(cost / self.TARGET)
        if self.failures:
            k = min(k, math.ceil(math.sqrt(cost * self.steps / self.failures)))
        self.size = max(1, min(k, 4 * self.size, self.LIMIT))


def _loss_record(step: int, loss: float, planned: set[int], h: Harnessed) -> dict:
    rec: dict[str, object] = {"step": step, "finite": True, "first_bad": None, "max_abs_update": None, "loss": loss}
    if step in planned:
        rec["injected"] = h.spec.inject
    return rec


def _same_loss(first: float, replayed: dict) -> bool:
    """A step's loss in the block run and in its replay are the same float32 (both non-finite counts
    as the same: a replay records a non-finite loss as null)."""
    if not math.isfinite(first):
        return replayed["loss"] is None
    return replayed["loss"] == first


def _run_blocks(h: Harnessed, seed: int, state: RunState, steps: int, planned: set[int],
                should_stop: Callable[[], bool]) -> Iterator[BlockResult]:
    """The block protocol (train): per step only the loss is kept (a device scalar), the step's
    outputs go straight back into it as in a plain loop; per block one host snapshot of the state
    before it and one check that every floating leaf is finite after it. A clean block (every loss
    finite, the state finite) is recorded as it ran. A block with a non-finite loss or state is
    restored from the snapshot and replayed with :func:`_run_steps` (check and rollback per step),
    so its records, counts and the trajectory that continues are the per-step protocol's: the batches
    are a function of (seed, step). The replayed losses are compared with the block run's up to the
    replay's first failure; a difference marks the step ``nondet`` (the step is not a function of its
    inputs), as does a failure the replay does not reproduce.

    The block's check sees what is in the state at its end: a step that writes a non-finite value
    which a later step of the same block removes again (a step that cleans its own state), or a
    non-finite ``aux["grads"]`` the step does not apply, is counted only with ``commit="step"``.
    Blocks holding a ``--reference`` sample or a finite injected fault (``lost-row``/``doubled-row``)
    run step by step from the start."""
    spec = h.spec
    # Every process must check (a collective) after the same steps: K is measured only in one process.
    size = h.block_size = h.block_size or BlockSize(spec.block if jax.process_count() == 1
                                                    else spec.block or DEFAULT_SYNC)
    snapshot = h.snapshot
    state.backup = None  # no second copy of the state in device memory
    s = state.next_step
    while s < steps:
        end = min(s + size.size, steps)
        finite_fault = spec.inject in ("lost-row", "doubled-row") and any(s <= t < end for t in planned)
        sampled = spec.reference and any(t % spec.reference_every == 0 for t in range(s, end))
        if finite_fault or sampled:
            state.backup = _copy((state.params, state.opt_state))
            yield from _run_steps(h, seed, state, end, planned, should_stop, end - s)
            state.backup = None
            if state.next_step < end:
                return
            s = end
            continue
        t0 = time.perf_counter()
        snapshot.take((state.params, state.opt_state))
        signature = jax.tree_util.tree_map(_abstract, (state.params, state.opt_state))
        t1 = time.perf_counter()
        losses, stop = [], False
        for t in range(s, end):
            k_data, k_fault = step_keys(seed, t)
            batch = _user(spec, "batch", h.program.batch, k_data, t)
            new_p, new_o, aux = _user(spec, "step", h.step, state.params, state.opt_state, batch)
            if t in planned:
                new_p, new_o = h.injector()(None, new_p, new_o, k_fault)
            state.params, state.opt_state = new_p, new_o
            losses.append(aux["loss"])
            state.next_step = t + 1
            if should_stop():
                stop = True
                break
        ran_to = state.next_step
        host_losses = [float(np.asarray(x).astype(np.float32)) for x in jax.device_get(losses)]
        t2 = time.perf_counter()
        state_ok = bool(jax.device_get(h.state_check(state.params, state.opt_state)))
        t3 = time.perf_counter()
        if state_ok and all(math.isfinite(x) for x in host_losses):
            records = [_loss_record(s + i, x, planned, h) for i, x in enumerate(host_losses)]
            size.update(ran_to - s, 0, t2 - t1, (t1 - t0) + (t3 - t2))
            yield BlockResult(h.label, seed, s, ran_to, records)
        else:
            state.params, state.opt_state = snapshot.restore()
            check_fed_back(h, (state.params, state.opt_state), signature)
            state.next_step, state.backup = s, _copy((state.params, state.opt_state))
            replay = next(_run_steps(h, seed, state, ran_to, planned, lambda: False, ran_to - s))
            state.backup = None
            _mark_nondeterminism(replay.records, host_losses)
            size.update(ran_to - s, replay.nonfinite or 1, t2 - t1, (t1 - t0) + (t3 - t2))
            yield replay
        if stop:
            return
        s = ran_to


def _mark_nondeterminism(replayed: list[dict], first_run: list[float]) -> None:
    """Mark ``nondet`` the first replayed step whose loss differs from the block run's, looking up to
    the replay's first failure (from there on the block run went on from a non-finite state and the
    replay from the rollback); a block whose failure the replay does not reproduce marks its last
    step when no loss differs."""
    for rec, first in zip(replayed, first_run, strict=True):
        if not _same_loss(first, rec):
            rec["nondet"] = True
            return
        if not rec["finite"]:
            return
    replayed[-1]["nondet"] = True


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
    # Restored as a plain loop holds its state at a later step: as the step returns it.
    returned = jax.eval_shape(h.step, state.params, state.opt_state, first_batch(h, seed))[:2]
    ck = load_checkpoint(_checkpoint_path(out, h.label, seed), tuple(returned)) \
        if jax.process_count() == 1 else None
    if ck is not None and ck[0] <= start:
        state.next_step, (state.params, state.opt_state) = ck[0], ck[1]
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
                    batch = state.batch if state.batch is not None else first_batch(h, seed)
                    check_step_outputs(h, state.params, state.opt_state, batch)
                    resumed = state.next_step > 0 and h.spec.protocol == "train"
                    fp = check_same_program(h, state.params, state.opt_state, batch, resumed)
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
    batch = state.batch if state.batch is not None else first_batch(h, 0)
    check_step_outputs(h, state.params, state.opt_state, batch)
    return h.step.lower(state.params, state.opt_state, batch).compile()
