"""Which values each position of each flattened instruction holds: the value it defines, or what it
forwards (tuple, get-tuple-element, bitcast, while/conditional/call parameters and roots, async
start/update/done), to a fixed point (a while body's parameter depends on its root)."""

from __future__ import annotations

from dataclasses import dataclass

from xla_harness.hlo.ir import Computation, Instruction
from xla_harness.hlo.memplan.model import Plan, chain_start, name_attr, operand, root, shape_of
from xla_harness.hlo.memplan.values import Index, Pos, indices
from xla_harness.hlo.timeline import called_in_order

# Async instructions whose positions forward values (besides every ``*-done``).
ASYNC_FORWARD = frozenset(("async-update", "async-start", "copy-start", "collective-permute-start",
                           "all-gather-start", "all-reduce-start"))
# Collective starts that keep their operands in their result until the done: the operands are read
# (and stay live) until the done, as XLA's dataflow forwards them (``UpdateAsyncStartValueSet`` and
# the collective starts' own updates).
OPERAND_HOLDERS = frozenset(("copy-start", "collective-permute-start", "all-gather-start", "all-reduce-start"))
_EMPTY: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Flow:
    """The values each position holds (:func:`dataflow`)."""

    sets: dict[Pos, frozenset[int]]

    def at(self, pos: Pos) -> frozenset[int]:
        return self.sets.get(pos, _EMPTY)


def dataflow(plan: Plan) -> Flow:
    """The :class:`Flow` of ``plan``'s flattened schedule."""
    sets: dict[Pos, frozenset[int]] = {}
    todo = [(comp, ins, indices(ins.shape)) for comp, ins in plan.tl.order]
    for _ in range(8):
        changed = False
        for comp, ins, idxs in todo:
            for idx in idxs:
                pos = (ins.name, idx)
                vid = plan.by_pos.get(pos)
                if vid is not None:
                    new = frozenset((vid,))
                else:
                    srcs = forward(plan, comp, ins, idx)
                    new = frozenset().union(*(sets.get(p, _EMPTY) for p in srcs))
                if new != sets.get(pos, _EMPTY):
                    sets[pos] = new
                    changed = True
        if not changed:
            break
    return Flow(sets)


def forward(plan: Plan, comp: Computation, ins: Instruction, idx: Index) -> list[Pos]:
    """Positions whose values ``ins`` holds at ``idx`` when it defines none there."""
    op = ins.opcode
    if op == "parameter":
        return _parameter_sources(plan, comp, ins, idx)
    if op in ASYNC_FORWARD or op.endswith("-done"):
        found = _forward_async(plan, comp, ins, idx)
        if found is not None:
            return found
    return _forward_structural(plan, comp, ins, idx)


def _forward_structural(plan: Plan, comp: Computation, ins: Instruction, idx: Index) -> list[Pos]:
    """get-tuple-element, bitcast and the other pass-throughs, tuple, while, conditional and call."""
    op = ins.opcode
    ops = ins.operands
    if op == "get-tuple-element" and ops:
        return [operand(ops[0], (int(ins.attrs.get("index", "0")),) + idx)]
    if op in ("bitcast", "domain", "opt-barrier", "optimization-barrier", "add-dependency", "async-update") and ops:
        return [operand(ops[0], idx)]
    if op == "tuple" and idx and idx[0] < len(ops):
        return [operand(ops[idx[0]], idx[1:])]
    if op == "while" and ops:
        body = root(plan.module, name_attr(ins, "body"))
        return [operand(ops[0], idx)] + ([(body.name, idx)] if body else [])
    if op in ("conditional", "call"):
        return [(r.name, idx) for c in called_in_order(ins) if (r := root(plan.module, c)) is not None]
    return []


def _forward_async(plan: Plan, comp: Computation, ins: Instruction, idx: Index) -> list[Pos] | None:
    """What an async start, update or done holds at ``idx``; None: handled as any other instruction."""
    op = ins.opcode
    ops = ins.operands
    if op == "async-update":
        return _forward_update(plan, comp, ins, idx)
    if op == "async-start":
        return _forward_start(plan, ins, idx) if idx else []
    source = (1,) if op == "copy-start" else (0,)  # where the start keeps its operands
    if op in OPERAND_HOLDERS and idx[:1] == source and ops:
        if holds_operand_tuple(comp, ins):  # ((operands...), outputs...): operand k at {0, k}
            if len(idx) > 1 and idx[1] < len(ops):
                return [operand(ops[idx[1]], idx[2:])]
            return []
        return [operand(ops[0], idx[1:])]
    if op.endswith("-done") and ops:
        src = comp.operand(ops[0])[0]
        inner = (0,) if op == "copy-done" else (1,) if _done_reads_one(src, ins) else ()
        return [operand(ops[0], inner + idx)]
    return None


def holds_operand_tuple(comp: Computation, start: Instruction) -> bool:
    """Whether a collective start keeps its operands as a tuple at {0} (``((f32[..]), f32[..])``, as
    XLA prints them now) rather than its one operand itself at {0} (``(f32[..], f32[..])``)."""
    if start.opcode == "copy-start" or not start.shape.tuple_shapes:
        return False
    held = start.shape.tuple_shapes[0]
    if held.tuple_shapes is None or len(held.tuple_shapes) != len(start.operands):
        return False
    return len(start.operands) != 1 or shape_of(comp, start.operands[0]) != held


def _done_reads_one(start: Instruction, done: Instruction) -> bool:
    """Whether a done's result is its start's {1} (the start is a tuple (operands, outputs, ..)) rather
    than the start's whole result (an all-reduce-start whose shape is its output's)."""
    outs = start.shape.tuple_shapes
    if outs is None or start.shape == done.shape or len(outs) < 2:
        return False
    return start.opcode != "all-reduce-start" or outs[1] == done.shape


def _forward_update(plan: Plan, comp: Computation, ins: Instruction, idx: Index) -> list[Pos] | None:
    """libtpu's call-start() then call-update(start, operands): the update holds its operands at
    {0, k} and the wrapped computation's root at {1}."""
    ops = ins.operands
    if len(ops) > 1 and idx:
        if idx[0] == 0 and len(idx) > 1 and idx[1] + 1 < len(ops):
            return [operand(ops[idx[1] + 1], idx[2:])]
        start = chain_start(comp, ins)
        if idx[0] == 1 and start.called and (r := root(plan.module, start.called[0])) is not None:
            return [(r.name, idx[1:])]
    return None


def _forward_start(plan: Plan, ins: Instruction, idx: Index) -> list[Pos]:
    """An async start holds its operands at {0, k} and its wrapped computation's root at {1}."""
    ops = ins.operands
    if idx[0] == 0 and len(idx) > 1 and idx[1] < len(ops):
        return [operand(ops[idx[1]], idx[2:])]
    if idx[0] == 1 and ins.called and (r := root(plan.module, ins.called[0])) is not None:
        return [(r.name, idx[1:])]
    return []


def _parameter_sources(plan: Plan, comp: Computation, ins: Instruction, idx: Index) -> list[Pos]:
    found = plan.tl.caller.get(comp.name)
    if found is None:
        return []
    caller, where = found
    n = ins.parameter_number
    op = caller.opcode
    if op == "while":
        body = root(plan.module, name_attr(caller, "body"))
        return [operand(caller.operands[0], idx)] + ([(body.name, idx)] if body else [])
    if op == "conditional":
        branches = called_in_order(caller)
        k = branches.index(comp.name) + 1 if comp.name in branches else -1
        return [operand(caller.operands[k], idx)] if 0 < k < len(caller.operands) else []
    if n < len(caller.operands):
        return [operand(caller.operands[n], idx)]
    update = plan.deferred.get(caller.name)
    if update is not None and n + 1 < len(update.operands):
        return [operand(update.operands[n + 1], idx)]
    return []
