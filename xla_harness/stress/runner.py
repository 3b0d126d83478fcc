"""Stress runner: call a program's training step again and again and count non-finite steps.

The measured program is the user's step compiled as the user compiles it
(:meth:`TrainProgram.jit`: same donation, same shardings, nothing inserted), proven equal to a plain
loop's ``jax.jit`` of it and compiled once (:mod:`~xla_harness.stress.proof.same_program`). Everything the
harness adds runs in *separate* jitted functions over the step's inputs and outputs:

* **checks** (is the loss finite, every new parameter and optimizer-state leaf,
  ``aux["grads"]``/``aux["updates"]`` when the step exposes them);
* **commit** (protocol ``train``): both count a step by its first execution from a finite state
  and roll back a step whose new state is not finite (params *and* optimizer state), so one event
  is one failure and every step is one Bernoulli trial. ``block`` (default,
  :mod:`~xla_harness.stress.loop.blocks`) feeds the step's outputs straight back, writes one row per step
  on the device (:mod:`~xla_harness.stress.device.step_rows`) fetched once per block while the next runs,
  and rolls back by rerunning at most one block from a device copy of the state taken at the block's
  start (:mod:`~xla_harness.stress.loop.restore`; reruns are never counted). ``step``
  (:mod:`~xla_harness.stress.loop.steps`) commits every step against a copy kept on device;
* **fault injection** (``inject_rate``, keyed by (seed, step) and planned on the host):
  corrupts the step's *output* between calls and is recorded per step as ``injected``;
  NaN/inf kinds prove the detector, the finite kinds (a lost or doubled row of the target
  matrix's update) prove ``reference``;
* **nondeterminism**: frozen compares every call's outputs bitwise with the seed's first finite
  call's (``nondet``); train reports the reruns that rebuild a state and differ from their first
  execution apart, on the block (``recompute``).

Protocols: ``train`` runs a trajectory (new batch every step, donated state); ``frozen`` is the
reporter's: identical params, optimizer state and batch on every call, no donation, each call a
trial of that input. Flags stay on device and are fetched once per block. ``reference``
recomputes steps in float64 on the CPU and flags finite-but-wrong updates per row of every matrix.
Results lines go through a writer thread (:mod:`~xla_harness.stress.results.sink`).

The pieces live beside this module: :mod:`~xla_harness.stress.spec` (the matrix),
:mod:`~xla_harness.stress.proof.harness` (one configuration), :mod:`~xla_harness.stress.device.inject`,
:mod:`~xla_harness.stress.device.checker`, :mod:`~xla_harness.stress.proof.fingerprint`,
:mod:`~xla_harness.stress.device.reference`, :mod:`~xla_harness.stress.loop.checkpoint`,
:mod:`~xla_harness.stress.loop.snapshot`; this module runs one configuration and the matrix.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import jax

from xla_harness.errors import HarnessError
from xla_harness.names import BUILTIN_PROGRAM as BUILTIN
from xla_harness.stress.device.inject import injected_steps
from xla_harness.stress.explain import Explainer, ExplainSpec
from xla_harness.stress.loop.block_size import BlockSize, new_block_size
from xla_harness.stress.loop.blocks import OnFailure, run_blocks
from xla_harness.stress.loop.checkpoint import Checkpointer, checkpoint_path, load_checkpoint
from xla_harness.stress.loop.steps import DEFAULT_SYNC, run_steps
from xla_harness.stress.proof.fingerprint import plain_jit
from xla_harness.stress.proof.harness import (
    BlockResult,
    Harnessed,
    RunState,
    check_fed_back,
    check_step_outputs,
    first_batch,
    initial_state,
    leaf_signature,
    prepare,
    prove_step,
)
from xla_harness.stress.results import provenance, records
from xla_harness.stress.results import store as results
from xla_harness.stress.results.sink import BlockStore, ResultsSink
from xla_harness.stress.spec import StressSpec, build

__all__ = ["DEFAULT_SYNC", "RESULTS_NAME", "BlockResult", "BlockSize", "Event", "Harnessed", "RunState",
           "block_line", "check_fed_back", "check_same_program", "check_step_outputs", "compile_train_step",
           "completed_steps", "first_batch", "initial_state", "leaf_signature", "prepare", "run_config",
           "run_matrix", "run_seed"]

RESULTS_NAME = "stress.jsonl"


def check_same_program(h: Harnessed, params, opt_state, batch, resumed: bool = False) -> Harnessed:
    """The step the harness runs, on the arguments it will call it with, against a plain loop's first
    step lowered independently: a fresh ``jax.jit(step, donate_argnums=..., **jit_kwargs)`` of the
    user's step, of a new function object (jax's caches hold nothing of the harness's lowering for
    it), on the arguments a plain loop has (``init``'s and ``batch``'s outputs, abstract).
    Equal StableHLO and compile arguments (avals with weak types, shardings, layouts, committedness,
    donation, compiler options), or HarnessError naming the first difference: a harness that changed
    an argument's dtype, weak type, sharding or committedness, or the donation, fails here. Then the
    harness's lowering is compiled, once, and the loop calls that executable. A run ``resumed`` from
    a checkpoint is compared with a plain loop's later step (its arguments: what the step returned).
    Later steps are held to the step's own outputs by :func:`check_fed_back`. Returns the proven
    configuration (its ``fingerprint``: the compiled step's)."""
    from xla_harness.targets.compile import abstract_arguments

    plain_args = abstract_arguments(h.program, jax.devices(), h.spec.program, place_unplaced=False)
    if resumed:  # a plain loop at a later step feeds what the step returned
        new_p, new_o, _ = jax.eval_shape(plain_jit(h.program, h.donate), *plain_args)
        plain_args = (new_p, new_o, plain_args[2])
    return prove_step(h, (params, opt_state, batch), plain_args)


def run_config(h: Harnessed, seed: int, state: RunState, steps: int | None = None,
               should_stop: Callable[[], bool] = lambda: False,
               checkpointer: Checkpointer | None = None,
               line_cost: Callable[[], float] = lambda: 0.0,
               block_size: BlockSize | None = None, on_failure: OnFailure | None = None) -> Iterator[BlockResult]:
    """Run steps [state.next_step, steps) and yield one BlockResult per block of steps.

    Train protocol, ``commit="block"`` (the default): :func:`~xla_harness.stress.loop.blocks.run_blocks`,
    the step's outputs fed straight back, a row per step fetched once per block a block late, a step
    whose new state is not finite rolled back by rerunning from the block's restore point.
    ``commit="step"`` and the frozen protocol: :func:`~xla_harness.stress.loop.steps.run_steps`, every
    step checked (and in train rolled back) as it comes. A stop request ends the current block early;
    the partial block is yielded so nothing that ran is lost. ``checkpointer`` (train): the
    ``--resume`` checkpoints, written where the loop has nothing in flight. ``line_cost``: what the
    consumer's results line costs, in CPU seconds (the block sizer counts it). ``block_size``: the
    block commit's sizer, carried from seed to seed by the caller (a new one when not given).
    ``on_failure``: the block commit's hook at each failing step (:func:`~xla_harness.stress.loop.blocks.run_blocks`).
    """
    spec = h.spec
    steps = spec.steps if steps is None else steps
    planned = set(injected_steps(seed, steps, spec.inject_rate).tolist())
    if spec.protocol == "train" and spec.commit == "block":
        yield from run_blocks(h, seed, state, steps, planned, should_stop, checkpointer, line_cost, block_size,
                              on_failure)
        return
    due = checkpointer.due if checkpointer is not None else (lambda: False)
    for block in run_steps(h, seed, state, steps, planned, should_stop, spec.block or DEFAULT_SYNC, drain=due):
        yield block
        if checkpointer is not None and state.next_step == block.end < steps and checkpointer.due():
            checkpointer.save(block.end, state.params, state.opt_state)


def built_with(options: dict) -> dict:
    """``TrainProgram.options`` (what the program says it was built with) as JSON: a value JSON cannot
    hold (a device list, a dtype) as its text."""
    return json.loads(json.dumps(dict(options), default=str))


def block_line(b: BlockResult, h: Harnessed, env: dict) -> records.Block:
    """The results record of a block: its steps' records as the loop made them (typed: nothing is
    parsed again on the way to the file), held to the block's invariants (:func:`records.check_block`)."""
    block = records.Block(label=b.label, seed=b.seed, start=b.start, end=b.end, nonfinite=b.nonfinite,
                          silent=b.silent, steps=tuple(b.records), config=h.options, env=env, time=provenance.now(),
                          program=h.spec.program, protocol=h.spec.protocol, fingerprint=h.fingerprint,
                          donate_argnums=tuple(h.donate), recompute=b.recompute,
                          built_with=built_with(h.program.options) if h.program.options else None,
                          commit=h.spec.commit if h.spec.protocol == "train" else None)
    try:
        records.check_block(block)
    except records.RecordError as exc:
        raise HarnessError(f"internal: refusing to write an invalid results record ({exc})") from None
    return block


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
    """State to continue from towards step ``start``: fresh at 0, the frozen protocol's inputs at
    ``start``, else (train) the checkpoint when it is not past ``start`` (its steps run again from
    ``state.next_step``: :func:`_replay_gap`)."""
    state = initial_state(h, seed)
    if start == 0:
        return state
    if h.spec.protocol == "frozen":  # the inputs never change
        return replace(state, next_step=start)
    # Restored as a plain loop holds its state at a later step: as the step returns it.
    returned = jax.eval_shape(h.jitted, state.params, state.opt_state, first_batch(h, seed))[:2]
    ck = load_checkpoint(checkpoint_path(out, h.label, seed), tuple(returned)) \
        if jax.process_count() == 1 else None
    if ck is not None and ck[0] <= start:
        return replace(state, next_step=ck[0], params=ck[1][0], opt_state=ck[1][1])
    return state


def _replay_gap(h: Harnessed, seed: int, state: RunState, start: int) -> None:
    """Run the steps between the checkpoint and ``start`` again, unrecorded (deterministic: same seed,
    same steps), in one block."""
    if state.next_step >= start:
        return
    quiet = replace(h, spec=replace(h.spec, reference=False, block=max(1, start - state.next_step)))
    for _ in run_config(quiet, seed, state, steps=start):
        pass


def run_seed(h: Harnessed, seed: int, state: RunState, store: BlockStore, out: Path, env: dict,
             should_stop: Callable[[], bool] = lambda: False,
             block_size: BlockSize | None = None, on_failure: OnFailure | None = None) -> Iterator[BlockResult]:
    """Run one (config, seed) to its end: every block appended to ``store`` (the results sink);
    train protocol: a checkpoint for --resume every ``checkpoint_seconds`` and when stopped early (a
    finished seed needs none), written after ``store`` has drained; the block sizer (``block_size``,
    the configuration's, carried from seed to seed) is told what a line costs ``store`` to write."""
    checkpointer = None
    if h.spec.protocol == "train" and jax.process_count() == 1:
        checkpointer = Checkpointer(h, checkpoint_path(out, h.label, seed), h.spec.checkpoint_seconds, should_stop,
                                    store.drain)
    for block in run_config(h, seed, state, should_stop=should_stop, checkpointer=checkpointer,
                            line_cost=store.line_cpu_seconds, block_size=block_size, on_failure=on_failure):
        store.append(block_line(block, h, env))
        yield block


def run_matrix(spec: StressSpec, out: Path, resume: bool = False,
               should_stop: Callable[[], bool] = lambda: False,
               on_event: Callable[[Event], None] | None = None,
               results_name: str = RESULTS_NAME, explain: ExplainSpec | None = None,
               log: Callable[[str], None] = lambda line: None) -> Path:
    """Run (or continue) the whole matrix, appending to ``out/results_name``. Returns the path.

    Before a configuration runs, the step the harness will call is proven equal to a plain
    ``jax.jit`` of the user's step and compiled once (HarnessError if they differ). ``explain``: once
    a configuration's seeds have run, the origin of its first failing steps
    (:mod:`~xla_harness.stress.explain`), appended to the same file; ``log`` gets its progress lines.
    """
    out = Path(out)
    path = out / results_name
    programs = [build(spec, options) for options in spec.configs()]  # bad --program: no results file
    # Locked, header and options checked, every line validated, torn tail repaired.
    with results.open_run(path, spec.to_dict(), resume=resume) as store, ResultsSink(store) as sink:
        done = completed_steps(store.blocks)
        env = provenance.environment()
        total = len(spec.configs()) * len(spec.seeds) * spec.steps
        done_steps = sum(min(v, spec.steps) for v in done.values())
        nonfinite = sum(b.nonfinite for b in store.blocks)
        emit = on_event or (lambda e: None)
        if store.header is None:  # written by the sink's thread, the first line, while step 0 compiles and runs
            sink.append(store.new_header(spec.to_dict(), env))
        elif spec.protocol == "train" and store.header.spec.get("commit", "block") != spec.commit:
            sys.stderr.write(f"warning: {path}: resumed with --commit {spec.commit}, begun with --commit "
                             f"{store.header.spec.get('commit', 'block')}; both count the same steps, and each "
                             "block records the commit it ran under\n")
        explainer = Explainer(explain, out, store.origins, store.blocks, log, frozen=spec.protocol == "frozen",
                              seeds=spec.seeds) if explain is not None else None
        for options, program in zip(spec.configs(), programs, strict=True):
            label = spec.label(options)
            h = None
            keep = explainer.keeper(label) if explainer is not None else None
            for seed in spec.seeds:
                start = done.get((label, seed), 0)
                if start >= spec.steps or should_stop():
                    continue
                if h is None:
                    h, block_size = prepare(spec, options, program), new_block_size(spec)
                state = _resume_state(h, out, seed, start)
                if h.fingerprint is None:
                    batch = state.batch if state.batch is not None else first_batch(h, seed)
                    check_step_outputs(h, state.params, state.opt_state, batch)
                    resumed = state.next_step > 0 and h.spec.protocol == "train"
                    h = check_same_program(h, state.params, state.opt_state, batch, resumed)
                    emit(Event("compiled", label, seed, done_steps, total, nonfinite,
                               fingerprint={**(h.fingerprint or {}), "donate_argnums": list(h.donate)}))
                _replay_gap(h, seed, state, start)
                for block in run_seed(h, seed, state, sink, out, env, should_stop, block_size, keep):
                    if explainer is not None:
                        explainer.note_block(block)
                    nonfinite += block.nonfinite
                    done_steps += block.end - block.start
                    emit(Event("block", label, seed, done_steps, total, nonfinite, block.end == spec.steps,
                               block=block))
            if explainer is not None and not should_stop() and explainer.pending(label):
                # every seed done before (--resume): the measured step, proven again
                explainer.explain(h or _proven(spec, options, program), sink.append, should_stop)
            if should_stop():
                break
    return path


def _proven(spec: StressSpec, options: dict, program) -> Harnessed:
    """A configuration's step prepared and proven as a run does before its first step (for explaining
    failures a finished run recorded)."""
    h = prepare(spec, options, program)
    seed = spec.seeds[0]
    state = initial_state(h, seed)
    batch = state.batch if state.batch is not None else first_batch(h, seed)
    check_step_outputs(h, state.params, state.opt_state, batch)
    return check_same_program(h, state.params, state.opt_state, batch)


def compile_train_step(options: dict | None = None, program: str = BUILTIN, protocol: str = "train"):
    """The program's step exactly as the harness runs it, compiled on the current backend (for scanning)."""
    options = dict(options or {})
    spec = StressSpec(program=program, protocol=protocol, program_options=tuple(sorted(options.items())))
    h = prepare(spec, options)
    state = initial_state(h, 0)
    batch = state.batch if state.batch is not None else first_batch(h, 0)
    check_step_outputs(h, state.params, state.opt_state, batch)
    return h.jitted.lower(state.params, state.opt_state, batch).compile()
