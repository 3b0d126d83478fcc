"""The races memcheck looks for, each a function of the earlier stages' results returning findings:

* ``overlap``: two values whose bytes intersect are never live at the same time, unless they are one
  buffer (or an instruction writes its output over an operand that dies at it: ``operand-reuse``);
* ``in-place``: within one buffer, a value written by an instruction is written after every read of
  the values it replaces (the writer may be the last reader, and an async writer reads until its done);
  ``donation`` is the same for a donated entry parameter. A fusion output aliased to an operand that
  the fusion only carries through (libtpu's async collective fusions) is not a write;
* ``async``: between an async start and its done, no other instruction writes bytes the operation
  reads or writes, nor reads bytes it writes (its own result included: that is read after the done).
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_harness.hlo.ir import Computation, Instruction
from xla_harness.hlo.memplan.dataflow import Flow
from xla_harness.hlo.memplan.liveness import Liveness
from xla_harness.hlo.memplan.model import Plan, fused_root_target, operand, shape_of
from xla_harness.hlo.memplan.report import Finding
from xla_harness.hlo.memplan.rules import Buffers
from xla_harness.hlo.memplan.values import Value, bytes_meet, indices
from xla_harness.hlo.timeline import ASYNC_STARTS


@dataclass(frozen=True)
class Stages:
    """The earlier stages' results, as the checks read them."""

    plan: Plan
    flow: Flow
    buffers: Buffers
    live: Liveness

    def one_buffer(self, a: Value, b: Value) -> bool:
        return self.buffers.of(a.v.id) == self.buffers.of(b.v.id)


def _describe(s: Stages, v: Value) -> dict:
    tl = s.plan.tl
    return {"value": v.label, "interval": [v.start, v.end], "defined_by": tl.at(v.start),
            "last_at": tl.at(v.end), "source": s.plan.sources.get(v.v.name, "")}


def conflict(s: Stages, kind: str, a: Value, b: Value, why: str) -> Finding:
    lo = max(a.v.offset, b.v.offset)
    hi = min(a.v.offset + a.v.size, b.v.offset + b.v.size)
    da, db = _describe(s, a), _describe(s, b)
    second = "" if a is b else (f" and {b.label} live {b.start}-{b.end} ({db['defined_by']} .. "
                                f"{db['last_at']}{', ' + db['source'] if db['source'] else ''})")
    msg = (f"{kind}: allocation {a.allocation} bytes [{lo}, {hi}) (color {a.v.color}): "
           f"{a.label} live {a.start}-{a.end} ({da['defined_by']} .. {da['last_at']}"
           f"{', ' + da['source'] if da['source'] else ''}){second}: {why}")
    return Finding(kind, msg, {"allocation": a.allocation, "bytes": [lo, hi], "color": a.v.color, "a": da, "b": db})


# ----------------------------------------------------------------------------- overlap

def overlap(s: Stages) -> tuple[int, list[Finding]]:
    """(byte-overlapping pairs of live values looked at, overlap findings)."""
    by_alloc: dict[int, list[Value]] = {}
    for v in s.live.values.values():
        if v.start >= 0 and v.v.size > 0:
            by_alloc.setdefault(v.allocation, []).append(v)
    pairs, found = 0, []
    for vs in by_alloc.values():
        vs.sort(key=lambda v: (v.start, v.end))
        active: list[Value] = []
        for b in vs:
            active = [a for a in active if a.end >= b.start]
            for a in active:
                if a.v.offset >= b.v.offset + b.v.size or b.v.offset >= a.v.offset + a.v.size:
                    continue
                pairs += 1
                if s.one_buffer(a, b) or _reuses(s, a, b) or _reuses(s, b, a) or _exclusive(s, a, b):
                    continue
                found.append(conflict(s, "overlap", a, b, "both live, not one buffer"))
            active.append(b)
    return pairs, found


def _reuses(s: Stages, a: Value, b: Value) -> bool:
    """operand-reuse: b is written by the instruction that last reads a, over a's bytes."""
    if a.end != b.start or b.v.phi:
        return False
    writer = s.plan.tl.at(b.start)
    return any(t == a.end and who == writer for t, who in a.uses)


def _exclusive(s: Stages, a: Value, b: Value) -> bool:
    """Both defined inside different branches of one conditional (never both run)."""
    ca, cb = _branch_of(s, a), _branch_of(s, b)
    return ca is not None and cb is not None and ca[0] == cb[0] and ca[1] != cb[1]


def _branch_of(s: Stages, v: Value) -> tuple[str, str] | None:
    for name, (lo, hi) in s.plan.branch_spans:
        if lo <= v.start and v.end <= hi:
            return s.plan.tl.caller[name][0].name, name
    return None


# ----------------------------------------------------------------------------- in-place

def written(s: Stages, v: Value) -> bool:
    """Whether the instruction defining ``v`` writes its bytes: not a parameter, not a phi, and not
    an aliased fusion output that only carries its operand through."""
    return not (v.v.phi or v.v.name in s.plan.params or v.v.id in s.plan.carried)


def in_place(s: Stages) -> list[Finding]:
    entry_params = {p.name for p in s.plan.module.entry.instructions if p.opcode == "parameter"}
    groups: dict[tuple[int, int], list[Value]] = {}
    for vid, v in s.live.values.items():
        if v.start >= 0:
            groups.setdefault((s.buffers.of(vid), v.allocation), []).append(v)
    found = []
    for vs in groups.values():
        if len(vs) < 2:
            continue
        vs.sort(key=lambda v: (v.start, v.v.id))
        for b in vs:
            writer = s.plan.tl.at(b.start)
            if not written(s, b):
                continue
            for a in vs:
                if a is b or a.start >= b.start or not bytes_meet(a, b):
                    continue
                late = [(t, who) for t, who in a.reads if t >= b.start and who != writer]
                if late:
                    t, who = max(late)
                    kind = "donation" if a.v.name in entry_params else "in-place"
                    found.append(conflict(s, kind, a, b, f"{writer} writes {b.label} over {a.label} at {b.start}, "
                                                         f"but {who} reads {a.label} at {t}"))
    return found


# ----------------------------------------------------------------------------- async

Times = tuple[list[list[Value]], list[list[Value]]]  # per time: the values written there, those read there


def async_windows(s: Stages) -> tuple[int, list[Finding]]:
    """(async windows checked, async findings): every async start with its done, and libtpu's async
    collective fusions."""
    tl = s.plan.tl
    defs: list[list[Value]] = [[] for _ in range(tl.end)]
    reads: list[list[Value]] = [[] for _ in range(tl.end)]
    for v in s.live.values.values():
        if 0 <= v.start < tl.end and written(s, v):
            defs[v.start].append(v)
        for t, who in v.reads:
            if 0 <= t < tl.end and tl.at(t) == who:
                reads[t].append(v)
    windows, found = 0, []
    for comp, ins in tl.order:
        if ins.opcode in ASYNC_STARTS and ins.name in s.plan.dones:
            windows += 1
            found += _window(s, comp, ins, tl.time[s.plan.dones[ins.name]], (defs, reads))
    members: dict[int, list[Value]] = {}
    for vid, v in s.live.values.items():
        members.setdefault(s.buffers.of(vid), []).append(v)
    for start, done in collective_fusions(s):
        windows += 1
        found += _collective_window(s, start, done, (defs, reads), members)
    return windows, found


def _window(s: Stages, comp: Computation, ins: Instruction, td: int, at: Times) -> list[Finding]:
    """Between ``ins`` (an async start) and its done at ``td``: no other instruction writes bytes it
    reads or writes, nor reads bytes it writes (its own result included: that is read after the done)."""
    tl, flow, values = s.plan.tl, s.flow, s.live.values
    defs, reads = at
    ts = tl.time[ins.name]
    inside = set(range(*tl.span[ins.called[0]])) if ins.called and ins.called[0] in tl.span else set()
    written_ = [values[vid] for idx in indices(ins.shape) for vid in flow.at((ins.name, idx))
                if values[vid].start == ts]
    written_ += [v for t in inside for v in defs[t]]
    read = [values[vid] for ref in ins.operands for idx in indices(shape_of(comp, ref))
            for vid in flow.at(operand(ref, idx))]
    mine = {v.v.id for v in written_ + read}
    own = {v.v.id for v in written_}
    w_alloc = {v.allocation for v in written_}
    r_alloc = {v.allocation for v in read}
    found = []
    for t in range(ts + 1, td):
        if t in inside or tl.order[t][1].opcode == "async-update":
            continue
        for x in defs[t]:
            if x.v.id not in mine and x.allocation in w_alloc | r_alloc:
                for y in _met(s, x, t, written_ + read):
                    what = "writes" if y in written_ else "reads"
                    found.append(conflict(s, "async", y, x, f"{tl.at(t)} writes {x.label} at {t} while {ins.name} "
                                                            f"({ts}-{td}) {what} those bytes"))
        for x in reads[t]:
            if x.v.id in own:  # the operation's own result, read before its done
                found.append(conflict(s, "async", x, x, f"{tl.at(t)} reads {x.label} at {t} while {ins.name} "
                                                        f"({ts}-{td}) writes it, before its done"))
            elif x.v.id not in mine and x.allocation in w_alloc:
                for y in _met(s, x, t, written_):
                    found.append(conflict(s, "async", y, x, f"{tl.at(t)} reads {x.label} at {t} while {ins.name} "
                                                            f"({ts}-{td}) writes those bytes"))
    return found


def _met(s: Stages, x: Value, t: int, ys: list[Value]) -> list[Value]:
    """The values of ``ys`` still live at ``t`` whose bytes meet ``x``'s, not of its buffer."""
    return [y for y in ys if y.end >= t and y.allocation == x.allocation and bytes_meet(x, y)
            and not s.one_buffer(x, y)]


# libtpu's async collectives: a fusion whose root is the AsyncCollectiveStart custom-call starts
# it, continuation fusions carry its buffers on (each output aliased to the operand it takes them
# from), and a fusion whose root is AsyncCollectiveDone ends it.

def collective_fusions(s: Stages) -> list[tuple[Instruction, Instruction]]:
    """(start fusion, done fusion) of each libtpu async collective, paired through the buffers the
    done takes (their values are in the start's output buffers)."""
    plan, flow = s.plan, s.flow
    owner: dict[int, Instruction] = {}  # buffer -> the start fusion whose output it is
    out = []
    for comp, ins in plan.tl.order:
        marker = fused_root_target(plan.module, ins)
        if marker == "AsyncCollectiveStart":  # its written buffers (the source it carries may be shared)
            for idx in indices(ins.shape):
                for vid in flow.at((ins.name, idx)):
                    if vid not in plan.carried:
                        owner.setdefault(s.buffers.of(vid), ins)
        elif marker == "AsyncCollectiveDone":
            starts = {owner[g].name: owner[g] for ref in ins.operands for idx in indices(shape_of(comp, ref))
                      for vid in flow.at(operand(ref, idx)) if (g := s.buffers.of(vid)) in owner}
            if len(starts) == 1:
                out.append((next(iter(starts.values())), ins))
    return out


def _collective_window(s: Stages, start: Instruction, done: Instruction, at: Times,
                       members: dict[int, list[Value]]) -> list[Finding]:
    """Between a libtpu async collective's start and done fusions: only the fusions carrying its
    buffers on read what it writes (the gathered result, its flags), and no other instruction
    writes bytes of any of its buffers."""
    tl, flow, values = s.plan.tl, s.flow, s.live.values
    defs, reads = at
    ts, td = tl.time[start.name], tl.time[done.name]
    mine = [values[vid] for idx in indices(start.shape) for vid in flow.at((start.name, idx))]
    groups = {s.buffers.of(v.v.id) for v in mine}
    in_flight = {s.buffers.of(v.v.id) for v in mine if v.v.id not in s.plan.carried}
    held: dict[int, list[Value]] = {}  # allocation -> the values of the collective's buffers in it
    for v in (v for g in groups for v in members.get(g, [])):
        held.setdefault(v.allocation, []).append(v)
    found = []
    for t in range(ts + 1, td):
        comp, ins = tl.order[t]
        if _carries(s, comp, ins, groups):
            continue
        for x in reads[t]:
            if s.buffers.of(x.v.id) in in_flight:
                found.append(conflict(s, "async", x, x, f"{tl.at(t)} reads {x.label} at {t} while the async "
                                                        f"collective {start.name} .. {done.name} ({ts}-{td}) "
                                                        "writes it, before its done"))
        for x in defs[t]:
            if s.buffers.of(x.v.id) in groups:
                continue
            for y in _met(s, x, t, held.get(x.allocation, [])):
                found.append(conflict(s, "async", y, x, f"{tl.at(t)} writes {x.label} at {t} while the async "
                                                        f"collective {start.name} .. {done.name} ({ts}-{td}) "
                                                        "holds those bytes"))
    return found


def _carries(s: Stages, comp: Computation, ins: Instruction, groups: set[int]) -> bool:
    """Whether ``ins`` carries one of the collective's buffers on: an output aliased to an operand
    whose value is in one of them (a continuation fusion), or the done itself."""
    if fused_root_target(s.plan.module, ins) == "AsyncCollectiveDone":
        return True
    if "output_to_operand_aliasing" not in ins.attr_text:
        return False
    return any(k < len(ins.operands)
               and any(s.buffers.of(vid) in groups for vid in s.flow.at(operand(ins.operands[k], oi)))
               for _, k, oi in ins.output_to_operand_aliasing())
