"""The per-step protocols: every step checked as it runs. ``frozen`` checks each call's outputs and
compares them bitwise with the seed's first finite call's (``nondet``); ``train`` with ``--commit
step`` commits each step (a non-finite one rolled back to a backup copy kept on the device), and the
block protocol runs a block holding a finite fault or a ``--reference`` sample this way.

The checks stay on the device: each step's flags are written as one row of its block's array
(:class:`FlagPacker`), fetched in one transfer, one block late (the next block is dispatched
first, so the device never waits for the host).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import jax

from xla_harness.errors import HarnessError
from xla_harness.stress.device.inject import step_keys
from xla_harness.stress.device.reference import reference_check
from xla_harness.stress.device.step_rows import FlagPacker
from xla_harness.stress.loop.pipeline import Pipeline, Verdict
from xla_harness.stress.proof.harness import (
    BlockResult,
    Harnessed,
    RunState,
    abstract,
    check_fed_back,
    follow_signature,
)
from xla_harness.stress.results.records import Step

DEFAULT_SYNC = 10  # steps per host sync of the per-step protocols when --block is not given


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


def host_records(start: int, host_flags: list, h: Harnessed, planned: set[int],
                 names: list[str] | None = None) -> list[Step]:
    """The records of steps ``start``... from their flags on the host; ``names``: the step's output
    leaves (frozen: which leaves a nondeterministic call changed)."""
    out = []
    for i, f in enumerate(host_flags):
        first = None if bool(f["ok"]) else (_first_bad(f, h) or "?")
        mx, loss = float(f["max_abs_update"]), float(f["loss"])
        nondet = bool(f.get("nondet", False))
        detail = tuple(leaf_detail(names, f["nondet_detail"])) if nondet and "nondet_detail" in f and \
            names is not None else None
        out.append(Step(start + i, first is None, first, mx if math.isfinite(mx) else None,
                        loss if math.isfinite(loss) else None,
                        injected=h.spec.inject if start + i in planned else None, nondet=nondet,
                        nondet_detail=detail))
    return out


def output_names(outputs) -> list[str]:
    """Names of the leaves of a step's ``(params, opt_state, aux)``: ``params['embed']``, ..."""
    return [f"{part}{jax.tree_util.keystr(path)}" for part, tree in zip(("params", "opt_state", "aux"), outputs,
                                                                        strict=True)
            for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def leaf_detail(names: list[str], detail) -> list[dict]:
    """The leaves a nondeterministic call changed (rows of ``differences.differences``): name, elements that
    differ in any bit, the largest absolute and ULP difference; most elements first."""
    out = []
    for name, (count, gap, ulp) in zip(names, detail, strict=True):
        if count > 0:
            out.append({"leaf": name, "elements": int(count),
                        "max_abs": float(gap) if math.isfinite(gap) else None,
                        "max_ulp": float(ulp) if math.isfinite(ulp) else None})
    return sorted(out, key=lambda d: -d["elements"])


@dataclass
class _Checked:
    """What a run of checked steps keeps besides the seed's state (:class:`RunState`), its own.
    Train: ``backup``, the last good (params, opt_state) in buffers of their own (a non-finite step is
    rolled back to it). Frozen: ``first``, the outputs of the seed's first finite call (on the
    device), and ``first_ok``, whether ``first`` is a finite call's yet (a device flag)."""

    backup: tuple | None = None
    first: object = None
    first_ok: object = None

    @classmethod
    def start(cls, h: Harnessed, state: RunState) -> _Checked:
        if h.spec.protocol == "train":
            return cls(backup=h.copy((state.params, state.opt_state)))
        return cls()

    def last_good(self) -> tuple:
        """Train: the backup copy of the last good (params, opt_state)."""
        if self.backup is None:
            raise HarnessError("internal: a per-step train run without its backup copy (_Checked.start makes it)")
        return self.backup


class _Pending:
    """A block of checked steps whose packed flags are on their way to the host."""

    def __init__(self, start: int, end: int, packed: tuple[jax.Array, tuple], refs: dict[int, dict],
                 details: dict[int, jax.Array], names: list[str] | None) -> None:
        self.start, self.end, (self.packed, self.layout), self.refs = start, end, packed, refs
        self.details = details  # frozen: step -> its nondeterminism detail, left on the device
        self.names = names  # frozen: the names of the step's output leaves
        self.packed.copy_to_host_async()

    def resolve(self, h: Harnessed, seed: int, planned: set[int]) -> BlockResult:
        host = FlagPacker.unpack(h.counters.fetch(self.packed), self.end - self.start, self.layout)
        for i, f in enumerate(host):
            # Which leaves differ, fetched only for a step that did differ (a finding: one more read).
            if bool(f.get("nondet", False)) and self.start + i in self.details:
                f["nondet_detail"] = h.counters.fetch(self.details[self.start + i])
        records = host_records(self.start, host, h, planned, self.names)
        rolled_back = {self.start + i for i, f in enumerate(host) if "state_ok" in f and not bool(f["state_ok"])}
        for i, r in enumerate(records):
            if r.step in self.refs:
                ref = self.refs.pop(r.step)
                # A rejected (non-finite) step was not applied: nothing to compare.
                records[i] = replace(r, reference=ref if r.finite else {**ref, "ok": True, "skipped": "non-finite"})
        return BlockResult(h.label, seed, self.start, self.end, records,
                           rolled_back=rolled_back if h.spec.protocol == "train" else set())


def _checked_step(h: Harnessed, seed: int, state: RunState, own: _Checked, s: int, planned: set[int],
                  refs: dict[int, dict], watched: bool, details: dict[int, jax.Array]) -> dict:
    """Step ``s`` and its check (train: committed or rolled back), everything on the device; the
    flags. The seed moves on to step ``s + 1``."""
    spec = h.spec
    frozen = spec.protocol == "frozen"
    k_fault = step_keys(seed, s)[1]
    batch = state.batch if frozen else h.batch(seed, s)
    sample = spec.reference and s % spec.reference_every == 0
    if sample:
        before = jax.device_get((state.params, state.opt_state, batch))
    new_p, new_o, aux = h.call_step(state.params, state.opt_state, batch)
    if s in planned:
        old_p = state.params if frozen else own.last_good()[0]
        new_p, new_o = h.inject(old_p, new_p, new_o, k_fault)
    if sample:
        refs[s] = reference_check(h.program, before[0], before[1], before[2], jax.device_get(new_p))
    if frozen:
        flags = dict(h.checker(state.params, new_p, new_o, aux))
        outputs = (new_p, new_o, aux)
        if own.first is None:  # the seed's first call: compared with a copy of itself, no finite call yet,
            own.first, own.first_ok = h.start_repeat(outputs)  # so the check compiles at step 0
        flags["nondet"], details[s], own.first, own.first_ok = h.repeat_check(
            own.first, own.first_ok, outputs, flags["ok"])
        state.move(state.params, state.opt_state, s + 1)
        return flags
    backup_p, backup_o = own.last_good()
    returned = abstract((new_p, new_o)) if watched else None
    flags, params, opt_state, bp, bo = h.commit(backup_p, backup_o, new_p, new_o, aux)
    own.backup = (bp, bo)
    state.move(params, opt_state, s + 1)
    if returned is not None:
        check_fed_back(h, (params, opt_state), returned)
        follow_signature(h, (params, opt_state, batch))
    return flags


def run_steps(h: Harnessed, seed: int, state: RunState, steps: int, planned: set[int],
              should_stop: Callable[[], bool], sync: int,
              drain: Callable[[], bool] = lambda: False) -> Iterator[BlockResult]:
    """Every step checked as it runs: train commits it (rollback of a non-finite step to the backup
    copy), frozen checks it and compares its outputs bitwise with the seed's first finite call's
    (``nondet``). Per ``sync`` steps the flags are packed on the device and fetched in one transfer
    after the next block's steps are dispatched (``drain()`` true at a block's end: fetched before,
    so the state is the block's end when it is yielded). What the checks keep besides the seed's state
    (train: the backup copy, taken here; frozen: the first finite call) lives as long as this run."""
    packer = FlagPacker(sync)
    rows: jax.Array | None = None
    n: jax.Array | None = None
    layout: tuple = ()
    count = 0
    block_start = first_checked = state.next_step
    own = _Checked.start(h, state)
    refs: dict[int, dict] = {}
    details: dict[int, jax.Array] = {}
    names: list[str] | None = None  # frozen: the step's output leaves, named once (the seed's first outputs)
    pipe: Pipeline[_Pending] = Pipeline(lambda block: Verdict(block.resolve(h, seed, planned)))
    for s in range(state.next_step, steps):
        # The first two feedbacks of each run are held to what the step returned.
        try:
            flags = _checked_step(h, seed, state, own, s, planned, refs, s <= first_checked + 1, details)
        except HarnessError:  # the program's error: the steps that ran before it stand
            if count and rows is not None:
                if names is None and own.first is not None:
                    names = output_names(own.first)
                yield from pipe.push(_Pending(block_start, s, (rows, layout), refs, details, names))
            yield from pipe.flush()
            raise
        if rows is None or n is None:
            rows, n, layout = packer.start(flags)
        rows, n = h.counters.dispatch(packer.write, rows, n, flags)
        count += 1
        stop = should_stop()
        if count == sync or s == steps - 1 or stop:
            if names is None and own.first is not None:
                names = output_names(own.first)
            yield from pipe.push(_Pending(block_start, s + 1, (rows, layout), refs, details, names))
            rows, count, refs, details, block_start = None, 0, {}, {}, s + 1
            if stop or s == steps - 1 or drain():
                yield from pipe.flush()
            if stop:
                return
    yield from pipe.flush()
