"""When each value is live: defined at its instruction's time in the flattened schedule (a parameter
from its computation's start, an async computation's values from their start), live through every
position that holds it and every use, to its computation's end when a root holds it; an entry
parameter that is not donated lives to the end. Also what was left out of the timing, and why."""

from __future__ import annotations

from dataclasses import dataclass

from xla_harness.hlo.ir import Computation, Instruction, split_ref
from xla_harness.hlo.memplan.dataflow import Flow
from xla_harness.hlo.memplan.model import Plan, chain_start, io_alias, name_attr
from xla_harness.hlo.memplan.values import Pos, Value, indices

# Instructions that pass their operands through rather than read them.
FORWARD = frozenset(("tuple", "get-tuple-element", "bitcast", "domain", "opt-barrier", "optimization-barrier",
                     "add-dependency", "while", "call", "conditional", "async-update", "async-done",
                     "copy-done", "all-reduce-done", "all-gather-done", "collective-permute-done",
                     "send-done", "recv-done"))


@dataclass(frozen=True)
class Liveness:
    """Every value of the buffer assignment with its interval, reads and uses (:func:`liveness`)."""

    values: dict[int, Value]

    def timed(self) -> list[Value]:
        return [v for v in self.values.values() if v.start >= 0]


def liveness(plan: Plan, flow: Flow) -> Liveness:
    """Each value's live interval in ``plan``'s flattened schedule, from the dataflow ``flow``."""
    tl = plan.tl
    values = {vid: Value(bv, plan.allocation_of[vid]) for vid, bv in plan.values.items()}
    defined_here: dict[int, tuple[Computation, Instruction]] = {}
    for comp, ins in tl.order:
        for idx in indices(ins.shape):
            vid = plan.by_pos.get((ins.name, idx))
            if vid is not None:
                defined_here[vid] = (comp, ins)
    ends = _starts(plan, values, defined_here)
    # positions (a root position lives to its computation's end)
    for comp, ins in tl.order:
        t = tl.span[comp.name][1] if ins.is_root else tl.time[ins.name]
        for idx in indices(ins.shape):
            for vid in flow.at((ins.name, idx)):
                if vid in ends and t > ends[vid]:
                    ends[vid] = t
    for vid, start_name in plan.hidden.tables.items():  # live from its start to its done, as XLA times it
        at = tl.time.get(start_name)
        if at is not None and vid not in ends:
            values[vid].start = at
            ends[vid] = max(at, _done_time(plan, start_name))
    _uses(plan, flow, values)
    entry = plan.module.entry
    donated = {(n, i) for _, (n, i) in io_alias(plan.module.input_output_alias)}
    for vid, end in ends.items():
        v = values[vid]
        where = defined_here.get(vid)  # None: a hidden async tuple table, timed from its start
        if where is not None and where[1].opcode == "parameter" and where[0] is entry \
                and (where[1].parameter_number, v.v.index) not in donated:
            v.end = tl.end
        else:
            v.end = max([end] + [t for t, _ in v.uses])
    return Liveness(values)


def _starts(plan: Plan, values: dict[int, Value], defined_here: dict[int, tuple[Computation, Instruction]]
            ) -> dict[int, int]:
    """Each defined value's start (set on it) and the end its definition gives it."""
    tl = plan.tl
    ends: dict[int, int] = {}
    for vid, (comp, ins) in defined_here.items():
        t = tl.time[ins.name]
        span = tl.span[comp.name]
        v = values[vid]
        v.start = span[0] if ins.opcode == "parameter" else t
        end = span[1] if ins.is_root else t
        ctx = tl.async_context.get(comp.name)
        if ctx is not None:
            end = max(end, _done_time(plan, ctx))
            v.start = max(v.start, _runs_from(plan, comp.name))
        ends[vid] = max(end, v.start)
    return ends


def _runs_from(plan: Plan, comp_name: str) -> int:
    """An async computation's values are written no earlier than its async start, as XLA times
    them (flattened just before the start, they become live with it); one whose start takes no
    operands (libtpu's ``call-start()``) runs once an async-update has given them: no earlier
    than that update."""
    tl = plan.tl
    t = -1
    c = comp_name
    for _ in range(1000):
        start = tl.async_context.get(c)
        if start is None or c not in tl.caller:
            break
        t = max(t, tl.time.get(start, -1))
        update = plan.deferred.get(start)
        if update is not None:
            t = max(t, tl.time.get(update.name, -1))
        c = tl.caller[c][1].name
    return t


def _done_time(plan: Plan, start_name: str) -> int:
    done = plan.dones.get(start_name)
    return plan.tl.time.get(done, -1) if done else -1


def _uses(plan: Plan, flow: Flow, values: dict[int, Value]) -> None:
    tl = plan.tl
    first: dict[Pos, int] = {}  # where a printed 'x#k' is read: before the first of its users
    for _, ins in tl.order:
        for ref in ins.operands:
            base, k = split_ref(ref)
            for j in range(1, len(k) + 1):
                first.setdefault((base, k[:j]), tl.time[ins.name])
    for comp, ins in tl.order:
        if ins.opcode in ("tuple", "domain"):  # not a use; but a printed 'x#k' operand is a read
            for ref in ins.operands:             # of x's tuple table by a get-tuple-element
                _use_tuple_tables(plan, flow, values, ins, ref, first)
            continue
        how = (*_use_times(plan, comp, ins), ins.opcode in ("get-tuple-element", "copy"))
        for ref in ins.operands:
            if comp.by_name.get(split_ref(ref)[0]) is not None:
                _use_tuple_tables(plan, flow, values, ins, ref, first)
                _use_operand(flow, values, comp, ins, ref, how)


def _use_operand(flow: Flow, values: dict[int, Value], comp: Computation, ins: Instruction, ref: str,
                 how: tuple[int, int, bool, bool]) -> None:
    """The uses (and real reads) of what operand ``ref`` of ``ins`` holds."""
    use_t, read_t, real, top_only = how
    base, k = split_ref(ref)
    try:
        sub = comp.by_name[base].shape.subshape(k)
    except IndexError:
        return
    for idx in ([()] if top_only else indices(sub)):
        for vid in flow.at((base, k + idx)):
            v = values[vid]
            if use_t >= 0:
                v.uses.append((use_t, ins.name))
            if real and not (sub.subshape(idx).is_tuple):
                v.reads.append((read_t, ins.name))


def _use_times(plan: Plan, comp: Computation, ins: Instruction) -> tuple[int, int, bool]:
    """(the use's time, -1: none; the read's time; whether it is a real read) of ``ins``'s operands."""
    tl = plan.tl
    t = tl.time[ins.name]
    read_t = tl.time.get(plan.dones.get(ins.name, ""), t)  # an async operation reads until its done
    real = ins.opcode not in FORWARD or (ins.opcode == "async-update" and len(ins.operands) > 1)
    if ins.opcode == "async-update":
        read_t = tl.time.get(plan.dones.get(chain_start(comp, ins).name, ""), t)
    use_t = t
    if ins.opcode == "while":
        body = plan.module.by_name.get(name_attr(ins, "body"))
        params = [p for p in body.instructions if p.opcode == "parameter"] if body else []
        use_t = tl.time.get(params[0].name, t) if params else t
    if ins.opcode == "call":
        use_t = -1
    return use_t, read_t, real


def _use_tuple_tables(plan: Plan, flow: Flow, values: dict[int, Value], ins: Instruction, ref: str,
                      first: dict[Pos, int]) -> None:
    """A printed 'x#1' is a get-tuple-element reading x's tuple table, one, before the first of
    its users."""
    base, k = split_ref(ref)
    t = plan.tl.time[ins.name]
    for j in range(len(k)):
        gte_t = first.get((base, k[:j + 1]), t)
        for vid in flow.at((base, k[:j])):
            values[vid].uses.append((gte_t, plan.tl.at(gte_t)))


# ----------------------------------------------------------------------------- coverage

LEFT_OUT = {
    "thread-local": "a value of a computation run inside an instruction (a reduction's to_apply, a sort's "
                    "comparator): thread-local scratch, outside the schedule; XLA's live range does not time "
                    "it either",
    "phi": "a phi of the compiler's dataflow: written by no instruction",
    "hidden-untied": "defined in an async wrapped computation the text prints as sugar, and not tied to its "
                     "start (dump with XLA_FLAGS=--xla_syntax_sugar_async_ops=false to check it)",
    "unscheduled": "defined in a computation outside the flattened schedule",
    "no-bytes": "a value of size 0: no byte to share",
}


@dataclass(frozen=True)
class Coverage:
    """Of the buffer assignment's values: how many were ``listed``, ``timed``, ``checked`` (timed, with
    bytes: every check sees them) and ``left_out`` by class (:data:`LEFT_OUT` says why)."""

    listed: int
    timed: int
    checked: int
    left_out: dict[str, int]

    def as_dict(self) -> dict:
        return {"listed": self.listed, "timed": self.timed, "checked": self.checked,
                "left_out": [{"class": k, "count": n, "why": LEFT_OUT[k]} for k, n in self.left_out.items()]}


def coverage(plan: Plan, live: Liveness) -> Coverage:
    """What was checked of ``plan``'s values, and what was left out and why."""
    untied = {v.id for v in plan.hidden.untied}
    left: dict[str, int] = {}
    checked = 0
    for vid, v in live.values.items():
        if v.start >= 0 and v.v.size > 0:
            checked += 1
            continue
        if v.start >= 0:
            why = "no-bytes"
        elif v.v.phi:
            why = "phi"
        elif vid in untied:
            why = "hidden-untied"
        elif "thread-local" in plan.ba.allocations[_index(plan, v.allocation)].attributes:
            why = "thread-local"
        else:
            why = "unscheduled"
        left[why] = left.get(why, 0) + 1
    return Coverage(len(live.values), len(live.timed()), checked, dict(sorted(left.items())))


def _index(plan: Plan, number: int) -> int:
    allocs = plan.ba.allocations
    if 0 <= number < len(allocs) and allocs[number].number == number:
        return number
    return next(i for i, a in enumerate(allocs) if a.number == number)
