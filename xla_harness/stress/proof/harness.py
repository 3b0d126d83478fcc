"""One configuration of a stress run, ready to run: the user's step (proven to be a plain loop's and
compiled once, :mod:`~xla_harness.stress.proof.same_program`), the harness's own functions outside it, and the
checks that hold what the harness feeds the step to what the step returned.

Also the per-seed state a run carries (:class:`RunState`), what a block of steps yields
(:class:`BlockResult`) and the counts that explain what the harness costs (:class:`Counters`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np

from xla_harness.errors import HarnessError
from xla_harness.programs.interface import TrainProgram, guard_user_error
from xla_harness.stress.device.checker import make_checker, make_commit, make_state_check
from xla_harness.stress.device.copies import copy_tree
from xla_harness.stress.device.differences import make_repeat_check, start_repeat
from xla_harness.stress.device.inject import make_injector, opt_target_index, step_keys, target_index
from xla_harness.stress.device.leaves import is_floating, leaf_names
from xla_harness.stress.device.step_rows import make_row_writer
from xla_harness.stress.proof.fingerprint import plain_jit
from xla_harness.stress.proof.same_program import ProvenStep, leaf_signature, signature
from xla_harness.stress.results.records import Step
from xla_harness.stress.spec import StressSpec, build


@dataclass
class Counters:
    """What the harness did beyond calling the step, counted where it happens (machine-independent,
    so tests can assert them): host syncs (each blocking fetch from the device or wait for it), the
    bytes those fetches copied to the host, and the jitted functions it dispatched (the user's step
    included). Nothing increments them by hand: the harness's functions are :meth:`counted`, every
    read of the device goes through :meth:`fetch`, :meth:`wait` or :meth:`to_host`, and the block
    loop, which calls the step and the row with no counting frame, tells :meth:`made` what it called
    (tests/stress/proof/test_new_signature.py holds that to a log of the calls themselves)."""

    host_syncs: int = 0
    d2h_bytes: int = 0
    dispatches: int = 0

    def dispatch(self, fn: Callable, *args):
        """``fn(*args)``: one dispatch of a jitted function."""
        self.dispatches += 1
        return fn(*args)

    def uncounted(self, fn: Callable) -> tuple[Callable, int]:
        """What a loop may call for ``fn`` with no counting frame around it, and the dispatches each call
        makes that the loop must count itself: ``fn``'s own function and 1 where ``fn`` is counted here,
        else ``fn`` itself (a replacement that counts what it calls) and 0."""
        if isinstance(fn, Counted) and fn.counters is self:
            return fn.fn, 1
        return fn, 0

    def made(self, calls: int) -> None:
        """``calls`` dispatches a loop made through what :meth:`uncounted` and
        :meth:`Harnessed.direct_step` gave it, counted by the loop once it has made them (a counting
        frame per call is host time on every step)."""
        self.dispatches += calls

    def counted(self, fn: Callable) -> Counted:
        """``fn`` with each call counted as one dispatch (a function already counted here is kept)."""
        return fn if isinstance(fn, Counted) and fn.counters is self else Counted(fn, self)

    def fetch(self, x) -> np.ndarray:
        """``x`` (one device array) on the host: one sync, its bytes counted."""
        host = np.asarray(jax.device_get(x))
        self.host_syncs += 1
        self.d2h_bytes += host.nbytes
        return host

    def wait(self, tree) -> None:
        """Wait for the device to have computed ``tree``: one sync, nothing copied."""
        jax.block_until_ready(tree)
        self.host_syncs += 1

    def to_host(self, copy: Callable, tree):
        """``copy(tree)``, a function that copies the whole of ``tree`` to host memory (a snapshot, a
        checkpoint): one sync, the tree's bytes counted."""
        out = copy(tree)
        self.host_syncs += 1
        self.d2h_bytes += sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))
        return out


@dataclass(frozen=True)
class Counted:
    """A jitted function of the harness's own (outside the user's step) whose every call is one
    dispatch in ``counters``."""

    fn: Callable
    counters: Counters

    def __call__(self, *args):
        self.counters.dispatches += 1  # what Counters.dispatch does, one call less a step (host time counts)
        return self.fn(*args)


@dataclass(frozen=True, eq=False)
class Harnessed:
    """A program with the harness's outside functions, for one configuration; frozen: nothing is
    assigned to it once made. The same-program proof (:func:`prove_step`) returns the proven
    configuration, a new one with ``step``, ``proven`` and ``fingerprint`` set. What changes as a run
    goes lives elsewhere and is passed explicitly: a seed's state (:class:`RunState`), the block
    protocol's loop and block sizer (:mod:`~xla_harness.stress.loop.blocks`), the executable for each
    argument signature met (:class:`~xla_harness.stress.proof.same_program.ProvenStep`); ``counters`` accumulate
    what the harness costs over the configuration's seeds."""

    program: TrainProgram
    spec: StressSpec
    label: str
    options: dict
    step: Callable  # what the loop calls: the proven executable once check_same_program ran, else the jit
    jitted: jax.stages.Wrapped  # the user's step, jitted as the user jits it (traced and lowered from here)
    checker: Callable
    commit: Callable
    names: list[str]
    opt_names: list[str]
    p_index: int
    o_index: int | None
    fingerprint: dict | None = None
    proven: ProvenStep | None = None
    state_check: Callable = field(default_factory=make_state_check)
    repeat_check: Callable = field(default_factory=make_repeat_check)
    write_row: Callable = field(default_factory=make_row_writer)  # block protocol: a step's row of its block
    counters: Counters = field(default_factory=Counters)
    copy: Callable = field(init=False)  # copy_tree, counted
    start_repeat: Callable = field(init=False)  # frozen: the repeat check's state before a seed's first call, counted
    inject: Callable = field(init=False)  # the --inject fault, planted after a chosen step (counted)

    @property
    def donate(self) -> tuple[int, ...]:
        return () if self.spec.protocol == "frozen" else tuple(self.program.donate_argnums)

    def __post_init__(self) -> None:
        counted = self.counters.counted  # every function of the harness's own: each call one dispatch
        made = {"checker": counted(self.checker), "commit": counted(self.commit),
                "state_check": counted(self.state_check), "repeat_check": counted(self.repeat_check),
                "write_row": counted(self.write_row), "copy": counted(copy_tree),
                "start_repeat": counted(start_repeat),
                "inject": counted(make_injector(self.spec.inject, self.p_index, self.o_index))}
        for name, fn in made.items():  # as it is made (frozen from here on)
            object.__setattr__(self, name, fn)

    def call_step(self, params, opt_state, batch):
        """One call of the user's step (guarded: what it raises is one HarnessError)."""
        self.counters.dispatches += 1
        try:
            return self.step(params, opt_state, batch)
        except BaseException as e:  # noqa: BLE001 - the user's code: one error line (as call_user)
            raise guard_user_error(e, self.spec.program, "step") from e

    def direct_step(self) -> Callable:
        """What a loop may call for the user's step with none of the harness's frames around it (the
        loop counts its dispatches and guards what it raises, as :meth:`call_step` does): the proven
        executable's own call once it has run (:attr:`ProvenStep.direct`), else ``step``. A call of it
        that raises TypeError or ValueError is made again through :meth:`call_step`, which follows a
        new signature; take it again after :func:`follow_signature` or such a call."""
        return self.step.direct if isinstance(self.step, ProvenStep) else self.step

    @property
    def step_compiles(self) -> int:
        """Compiles of the user's step so far (one per argument signature met, each proven first)."""
        return self.proven.compiles if self.proven is not None else 0

    def batch(self, seed: int, step: int):
        """The user's batch of ``step`` of ``seed`` (a function of the two)."""
        return call_user(self.spec, "batch", self.program.batch, step_keys(seed, step)[0], step)


def call_user(spec: StressSpec, what: str, fn: Callable, *args):
    """Call the user's ``init``/``batch``/``step`` (or trace it): whatever it raises, SystemExit and
    BaseException subclasses included, is one HarnessError naming the program and the function;
    KeyboardInterrupt stays an interrupt."""
    try:
        return fn(*args)
    except BaseException as e:  # noqa: BLE001 - the user's code: one error line, never a traceback or an exit
        raise guard_user_error(e, spec.program, what) from e


def _init_shapes(spec: StressSpec, program: TrainProgram, key) -> tuple:
    out = call_user(spec, "init", jax.eval_shape, program.init, key)
    if not isinstance(out, tuple | list) or len(out) != 2:
        got = f"a {len(out)}-tuple" if isinstance(out, tuple | list) else type(out).__name__
        raise HarnessError(f"--program {spec.program}: init returned {got}; expected (params, opt_state)")
    return tuple(out)


def check_step_outputs(h: Harnessed, params, opt_state, batch) -> None:
    """The structure of what the user's step returns, from ``jax.eval_shape`` (nothing runs, nothing is
    compiled, the measured program is unchanged): ``(params, opt_state, aux)``, the first two shaped
    like the inputs, ``aux`` a mapping holding a scalar ``"loss"``."""
    where = f"--program {h.spec.program}: step"
    out = call_user(h.spec, "step", jax.eval_shape, h.jitted, params, opt_state, batch)
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
    jitted = program.jit()
    return Harnessed(program, spec, spec.label(options), options, jitted, jitted, make_checker(), make_commit(),
                     _float_names(params), _float_names(opt_state), p_index, o_index)


def _float_names(tree) -> list[str]:
    return [n for n, x in zip(leaf_names(tree), jax.tree_util.tree_leaves(tree), strict=True) if is_floating(x)]


def _warn(said: str) -> None:
    sys.stderr.write(f"warning: {said}\n")


def prove_step(h: Harnessed, args: tuple, plain_args: tuple) -> Harnessed:
    """The same-program proof for the step's first call (:class:`~xla_harness.stress.proof.same_program.ProvenStep`):
    the harness's lowering on ``args`` against a plain loop's on ``plain_args``, compiled once. Returns
    the proven configuration: ``h`` with the loop calling that executable (``step``, ``proven``) and its
    ``fingerprint``; ``h`` itself is left as it was."""
    proven = h.proven or ProvenStep(h.jitted, lambda: plain_jit(h.program, h.donate, fresh=True), h.label,
                                    on_new_signature=_warn)
    try:
        fp = proven.prove(args, plain_args, signature(args))
    except HarnessError:
        raise
    except BaseException as e:  # noqa: BLE001 - lowering traces the user's step
        raise guard_user_error(e, h.spec.program, "step") from e
    return replace(h, step=proven, proven=proven, fingerprint=fp)


def follow_signature(h: Harnessed, args: tuple) -> None:
    """Before the harness feeds ``args`` (already held to what the step returned by
    :func:`check_fed_back`): the executable for their signature, proven and compiled the first
    time it is met (a plain loop whose arguments change signature compiles again too)."""
    if h.proven is None:
        return
    try:
        h.proven.follow(signature(args), args)
    except HarnessError:
        raise
    except BaseException as e:  # noqa: BLE001 - lowering traces the user's step
        raise guard_user_error(e, h.spec.program, "step") from e


_SIGNATURE_PARTS = ("shape", "dtype", "weak type", "sharding", "layout", "committedness")


class Abstract:
    """Stands for a leaf: its signature, taken before the step it is fed to donates it."""

    def __init__(self, x) -> None:
        self.signature = leaf_signature(x)


def abstract(tree):
    return jax.tree_util.tree_map(Abstract, tree)


def check_fed_back(h: Harnessed, fed, returned) -> None:
    """The state the harness feeds to the next step has the signature of what the step returned,
    leaf by leaf: what a plain loop (``params, opt = step(params, opt, batch)``) feeds. A difference
    (a weakly typed leaf made strong by a copy, a dtype, a sharding, a layout) would make the next
    call compile a different program: refused, naming the leaf."""
    fed_leaves = jax.tree_util.tree_flatten_with_path(fed)[0]
    ret_leaves = jax.tree_util.tree_leaves(returned)
    for (path, a), b in zip(fed_leaves, ret_leaves, strict=True):
        sa, sb = leaf_signature(a), b.signature if isinstance(b, Abstract) else leaf_signature(b)
        if sa != sb:
            i = next(i for i in range(len(sa)) if sa[i] != sb[i])
            raise HarnessError(f"{h.label}: the harness would feed {jax.tree_util.keystr(path)} back with "
                               f"{_SIGNATURE_PARTS[i]} {sa[i]} where the step returned {sb[i]}; the next call "
                               "would compile a different program from a plain loop's: refusing to measure it")


@dataclass(frozen=True, eq=False)
class RunState:
    """Where one (config, seed) stands: the next step and the state it starts from. Read anywhere,
    written by :meth:`move` alone, as a protocol's loop moves the seed on (an assignment from
    anywhere else is refused). What a protocol keeps besides is its own: the block protocol's
    rollback (:class:`~xla_harness.stress.loop.rollback.Rollback`), the per-step commit's backup copy
    and the frozen protocol's first call (:mod:`~xla_harness.stress.loop.steps`)."""

    next_step: int = 0
    params: object = None
    opt_state: object = None
    batch: object = None  # frozen protocol: the one batch every call gets (an input: set when made)

    def move(self, params, opt_state, next_step: int) -> None:
        """The seed is at ``next_step`` with state ``(params, opt_state)``."""
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "opt_state", opt_state)
        object.__setattr__(self, "next_step", next_step)


@dataclass
class BlockResult:
    label: str
    seed: int
    start: int
    end: int
    records: list[Step] = field(default_factory=list)  # each step's record (its first execution's)
    # Block protocol, a block whose last step's new state was not finite: how the state before that
    # step was rebuilt, {"from", "steps", "nondet", ["nonfinite", "tries", "unrecoverable"]} (the steps
    # whose recomputed loss differed from the one recorded; None: no recompute).
    recompute: dict | None = None
    rolled_back: set[int] = field(default_factory=set)  # steps whose new state was not finite (not kept)

    @property
    def nonfinite(self) -> int:
        return sum(not r.finite for r in self.records)

    @property
    def silent(self) -> int:
        return sum(1 for r in self.records if r.reference and not r.reference["ok"])

    @property
    def injected(self) -> int:
        return sum(1 for r in self.records if r.injected)


def initial_state(h: Harnessed, seed: int) -> RunState:
    params, opt_state = call_user(h.spec, "init", h.program.init, jax.random.key(seed))
    return RunState(0, params, opt_state, first_batch(h, seed) if h.spec.protocol == "frozen" else None)


def first_batch(h: Harnessed, seed: int):
    """The user's batch of step 0 of ``seed`` (guarded like every call of the user's code)."""
    return h.batch(seed, 0)
