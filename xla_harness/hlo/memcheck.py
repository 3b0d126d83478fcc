"""Check a compiled program's memory plan for races, from what the compiler dumps: the scheduled
module and its buffer assignment (and, where dumped, the compiler's live range to compare against).

The values are the buffer assignment's (each with its allocation, offset, size and memory space);
everything else is derived here from the module text: the flattened schedule
(:mod:`xla_harness.hlo.timeline`), which value each position holds (a small dataflow: tuples,
get-tuple-element, bitcast, while/conditional/call parameters and roots, async start/update/done),
each value's uses and live interval, and which values are one buffer (:data:`RULES`). Checks:

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

import gzip
import io
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.files import read_regular
from xla_harness.hlo import alias as alias_rules
from xla_harness.hlo.buffers import BufferAssignment, BufferValue, parse_buffer_assignment
from xla_harness.hlo.compiler_alias import instruction_pairs
from xla_harness.hlo.ir import Computation, HloModule, Instruction, split_ref
from xla_harness.hlo.parser import parse_module
from xla_harness.hlo.shapes import Shape
from xla_harness.hlo.timeline import (
    ASYNC_STARTS,
    LiveRangeDump,
    Timeline,
    called_in_order,
    flatten,
    parse_live_range,
    sequence_disagreements,
    time_map,
)

Index = tuple[int, ...]
Pos = tuple[str, Index]

# The rules putting values into one buffer (what XLA's alias analysis does), each named in findings.
RULES = {
    "while": "a while's init, condition and body parameters, body root and result are one buffer",
    "conditional": "a conditional's result and every branch's root are one buffer",
    "call": "a call's result and its computation's root are one buffer",
    "async": "an async start's result and its wrapped computation's root, and its done, are one buffer",
    "in-place": "an in-place op's output (dynamic-update-slice, scatter, in-place fusions, collectives) "
                "shares its operand's buffer",
    "output_to_operand_aliasing": "an output the instruction declares aliased to an operand",
    "backend-aliasing": "libtpu's aliasing_operands in backend_config",
    "donation": "an entry parameter and the output it is donated to (input_output_alias)",
}
# Instructions that pass their operands through rather than read them.
_FORWARD = frozenset(("tuple", "get-tuple-element", "bitcast", "domain", "opt-barrier", "optimization-barrier",
                      "add-dependency", "while", "call", "conditional", "async-update", "async-done",
                      "copy-done", "all-reduce-done", "all-gather-done", "collective-permute-done",
                      "send-done", "recv-done"))
# Async instructions whose positions forward values (besides every ``*-done``).
_ASYNC_FORWARD = frozenset(("async-update", "async-start", "copy-start", "collective-permute-start",
                            "all-gather-start", "all-reduce-start"))
# Collective starts that keep their operands in their result until the done: the operands are read
# (and stay live) until the done, as XLA's dataflow forwards them (``UpdateAsyncStartValueSet`` and
# the collective starts' own updates).
_OPERAND_HOLDERS = frozenset(("copy-start", "collective-permute-start", "all-gather-start", "all-reduce-start"))
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _indices(shape: Shape, prefix: Index = ()) -> list[Index]:
    out = [prefix]
    if shape.tuple_shapes is not None:
        for i, sub in enumerate(shape.tuple_shapes):
            out += _indices(sub, prefix + (i,))
    return out


def _root(module: HloModule, comp: str) -> Instruction | None:
    c = module.by_name.get(comp)
    return c.root if c is not None else None


@dataclass
class Value:
    v: BufferValue
    allocation: int
    start: int = -1  # -1: defined outside the flattened schedule (not timed)
    end: int = -1
    reads: list[tuple[int, str]] = field(default_factory=list)  # (time, reader) of real reads
    uses: list[tuple[int, str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        idx = "{" + ",".join(map(str, self.v.index)) + "}" if self.v.index else ""
        return f"{self.v.name}{idx}"


@dataclass
class Finding:
    kind: str
    message: str
    data: dict = field(default_factory=dict)


@dataclass
class Report:
    module: str
    values: int = 0
    timed: int = 0
    allocations: int = 0
    async_windows: int = 0
    pairs_checked: int = 0
    conflicts: list[Finding] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    live_range_compared: int = -1  # -1: no live-range dump
    unprinted_ends: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rules_used: dict[str, int] = field(default_factory=dict)
    aliasing_not_taken: int = 0  # libtpu's declared aliasing the buffer assignment placed on other bytes

    def as_dict(self) -> dict:
        return {"module": self.module, "values": self.values, "values_timed": self.timed,
                "allocations": self.allocations, "async_windows": self.async_windows,
                "byte_overlapping_pairs": self.pairs_checked,
                "conflicts": [{"kind": f.kind, "message": f.message, **f.data} for f in self.conflicts],
                "live_range_compared": self.live_range_compared,
                "live_range_disagreements": self.disagreements,
                "live_range_ends_at_unprinted_get_tuple_element": self.unprinted_ends, "rules_used": self.rules_used,
                "aliasing_not_taken": self.aliasing_not_taken, "seconds": round(self.seconds, 3)}


class _Union:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, a: int) -> int:
        p = self.parent.setdefault(a, a)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[a] = p
        return p

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


class Checker:
    def __init__(self, module: HloModule, ba: BufferAssignment, backend: str = "cpu",
                 disabled: frozenset[str] = frozenset()) -> None:
        self.disabled = disabled  # grouping rules left out (to show what each one prevents)
        self.module = module
        self.ba = ba
        self.backend = backend if backend in ("cpu", "gpu", "tpu") else "cpu"
        self.tl: Timeline = flatten(module)
        self.values: dict[int, Value] = {}
        self.by_pos: dict[Pos, int] = {}
        for a in ba.allocations:
            for bv in a.values:
                self.values[bv.id] = Value(bv, a.number)
                self.by_pos.setdefault((bv.name, bv.index), bv.id)
        self.sets: dict[Pos, frozenset[int]] = {}
        self.union = _Union()
        self.rules_used: dict[str, int] = {}
        self.not_taken = 0  # libtpu aliasing_operands the buffer assignment did not take (other bytes)
        # the structural in-place walk (TPU modules also state the compiler's own pairs: backend-aliasing)
        self._alias_model = alias_rules.model("stock", self.backend if self.backend in alias_rules.BACKEND_RULES
                                              else "cpu")
        self.unprinted: list[str] = []  # live-range ends at an unprinted get-tuple-element
        self._printed = {ins.name for comp in module.computations for ins in comp.instructions}

    # ------------------------------------------------------------------ dataflow

    def _operand(self, comp: Computation, ref: str, index: Index) -> Pos:
        base, k = split_ref(ref)
        return base, k + index

    def _forward(self, comp: Computation, ins: Instruction, idx: Index) -> list[Pos]:
        """Positions whose values ``ins`` holds at ``idx`` when it defines none there."""
        op = ins.opcode
        if op == "parameter":
            return self._parameter_sources(comp, ins, idx)
        if op in _ASYNC_FORWARD or op.endswith("-done"):
            found = self._forward_async(comp, ins, idx)
            if found is not None:
                return found
        return self._forward_structural(comp, ins, idx)

    def _forward_structural(self, comp: Computation, ins: Instruction, idx: Index) -> list[Pos]:
        """get-tuple-element, bitcast and the other pass-throughs, tuple, while, conditional and call."""
        op = ins.opcode
        ops = ins.operands
        if op == "get-tuple-element" and ops:
            return [self._operand(comp, ops[0], (int(ins.attrs.get("index", "0")),) + idx)]
        if op in ("bitcast", "domain", "opt-barrier", "optimization-barrier", "add-dependency", "async-update") and ops:
            return [self._operand(comp, ops[0], idx)]
        if op == "tuple" and idx and idx[0] < len(ops):
            return [self._operand(comp, ops[idx[0]], idx[1:])]
        if op == "while" and ops:
            body = _root(self.module, _name_attr(ins, "body"))
            return [self._operand(comp, ops[0], idx)] + ([(body.name, idx)] if body else [])
        if op in ("conditional", "call"):
            return [(r.name, idx) for c in called_in_order(ins) if (r := _root(self.module, c)) is not None]
        return []

    def _forward_async(self, comp: Computation, ins: Instruction, idx: Index) -> list[Pos] | None:
        """What an async start, update or done holds at ``idx``; None: handled as any other instruction."""
        op = ins.opcode
        ops = ins.operands
        if op == "async-update":
            return self._forward_update(comp, ins, idx)
        if op == "async-start":
            return self._forward_start(comp, ins, idx) if idx else []
        source = (1,) if op == "copy-start" else (0,)  # where the start keeps its operands
        if op in _OPERAND_HOLDERS and idx[:1] == source and ops:
            if self._holds_operand_tuple(comp, ins):  # ((operands...), outputs...): operand k at {0, k}
                if len(idx) > 1 and idx[1] < len(ops):
                    return [self._operand(comp, ops[idx[1]], idx[2:])]
                return []
            return [self._operand(comp, ops[0], idx[1:])]
        if op.endswith("-done") and ops:
            src = comp.operand(ops[0])[0]
            inner = (0,) if op == "copy-done" else (1,) if self._done_reads_one(src, ins) else ()
            return [self._operand(comp, ops[0], inner + idx)]
        return None

    def _holds_operand_tuple(self, comp: Computation, start: Instruction) -> bool:
        """Whether a collective start keeps its operands as a tuple at {0} (``((f32[..]), f32[..])``, as
        XLA prints them now) rather than its one operand itself at {0} (``(f32[..], f32[..])``)."""
        if start.opcode == "copy-start" or not start.shape.tuple_shapes:
            return False
        held = start.shape.tuple_shapes[0]
        if held.tuple_shapes is None or len(held.tuple_shapes) != len(start.operands):
            return False
        return len(start.operands) != 1 or _shape_of(comp, start.operands[0]) != held

    @staticmethod
    def _done_reads_one(start: Instruction, done: Instruction) -> bool:
        """Whether a done's result is its start's {1} (the start is a tuple (operands, outputs, ..)) rather
        than the start's whole result (an all-reduce-start whose shape is its output's)."""
        outs = start.shape.tuple_shapes
        if outs is None or start.shape == done.shape or len(outs) < 2:
            return False
        return start.opcode != "all-reduce-start" or outs[1] == done.shape

    def _forward_update(self, comp: Computation, ins: Instruction, idx: Index) -> list[Pos] | None:
        """libtpu's call-start() then call-update(start, operands): the update holds its operands at
        {0, k} and the wrapped computation's root at {1}."""
        ops = ins.operands
        if len(ops) > 1 and idx:
            if idx[0] == 0 and len(idx) > 1 and idx[1] + 1 < len(ops):
                return [self._operand(comp, ops[idx[1] + 1], idx[2:])]
            start = self._chain_start(comp, ins)
            if idx[0] == 1 and start.called and (r := _root(self.module, start.called[0])) is not None:
                return [(r.name, idx[1:])]
        return None

    def _forward_start(self, comp: Computation, ins: Instruction, idx: Index) -> list[Pos]:
        """An async start holds its operands at {0, k} and its wrapped computation's root at {1}."""
        ops = ins.operands
        if idx[0] == 0 and len(idx) > 1 and idx[1] < len(ops):
            return [self._operand(comp, ops[idx[1]], idx[2:])]
        if idx[0] == 1 and ins.called and (r := _root(self.module, ins.called[0])) is not None:
            return [(r.name, idx[1:])]
        return []

    def _parameter_sources(self, comp: Computation, ins: Instruction, idx: Index) -> list[Pos]:
        found = self.tl.caller.get(comp.name)
        if found is None:
            return []
        caller, where = found
        n = ins.parameter_number
        op = caller.opcode
        if op == "while":
            body = _root(self.module, _name_attr(caller, "body"))
            return [self._operand(where, caller.operands[0], idx)] + ([(body.name, idx)] if body else [])
        if op == "conditional":
            branches = called_in_order(caller)
            k = branches.index(comp.name) + 1 if comp.name in branches else -1
            return [self._operand(where, caller.operands[k], idx)] if 0 < k < len(caller.operands) else []
        if n < len(caller.operands):
            return [self._operand(where, caller.operands[n], idx)]
        update = self._deferred().get(caller.name)
        if update is not None and n + 1 < len(update.operands):
            return [self._operand(where, update.operands[n + 1], idx)]
        return []

    def _chain_start(self, comp: Computation, ins: Instruction) -> Instruction:
        seen = 0
        while ins.opcode in ("async-update", "async-done") and ins.operands and seen < 10_000:
            ins = comp.operand(ins.operands[0])[0]
            seen += 1
        return ins

    def _deferred(self) -> dict[str, Instruction]:
        """async start -> the async-update that gives it its operands (libtpu's call-start())."""
        if not hasattr(self, "_deferred_cache"):
            self._deferred_cache: dict[str, Instruction] = {}
            for comp, ins in self.tl.order:
                if ins.opcode == "async-update" and len(ins.operands) > 1:
                    self._deferred_cache.setdefault(self._chain_start(comp, ins).name, ins)
        return self._deferred_cache

    def dataflow(self) -> None:
        """Which values each position of each flattened instruction holds (to a fixed point: a while
        body's parameter depends on its root)."""
        todo = [(comp, ins, _indices(ins.shape)) for comp, ins in self.tl.order]
        for _ in range(8):
            changed = False
            for comp, ins, indices in todo:
                for idx in indices:
                    pos = (ins.name, idx)
                    vid = self.by_pos.get(pos)
                    if vid is not None:
                        new = frozenset((vid,))
                    else:
                        srcs = self._forward(comp, ins, idx)
                        new = frozenset().union(*(self.sets.get(p, frozenset()) for p in srcs))
                    if new != self.sets.get(pos, frozenset()):
                        self.sets[pos] = new
                        changed = True
            if not changed:
                return

    def at(self, pos: Pos) -> frozenset[int]:
        return self.sets.get(pos, frozenset())

    # ------------------------------------------------------------------ buffers (grouping rules)

    def _join(self, rule: str, positions: list[Pos]) -> None:
        if rule in self.disabled:
            return
        ids = [v for p in positions for v in self.at(p)]
        if rule == "backend-aliasing" and ids:
            # libtpu declares what may alias (two powers of one operand both name it); one buffer only
            # where the buffer assignment took it: the output on its operand's bytes
            first = self.values[ids[0]]
            taken = [o for o in ids[1:] if _bytes_meet(first, self.values[o])]
            self.not_taken += len(ids) - 1 - len(taken)
            ids = [ids[0]] + taken
        for other in ids[1:]:
            if self.union.find(other) != self.union.find(ids[0]):
                self.union.union(ids[0], other)
                self.rules_used[rule] = self.rules_used.get(rule, 0) + 1

    def group(self) -> None:
        m = self.module
        for comp, ins in self.tl.order:
            op = ins.opcode
            idxs = _indices(ins.shape)
            if op == "while":
                cond, body = (m.by_name.get(_name_attr(ins, k)) for k in ("condition", "body"))
                for idx in idxs:
                    ps: list[Pos] = [(ins.name, idx), self._operand(comp, ins.operands[0], idx)]
                    for c in (cond, body):
                        if c is not None:
                            ps += [(p.name, idx) for p in c.instructions if p.opcode == "parameter"]
                    if body is not None:
                        ps.append((body.root.name, idx))
                    self._join("while", ps)
            elif op in ("conditional", "call"):
                for idx in idxs:
                    self._join(op, [(ins.name, idx)] + [(r.name, idx) for c in called_in_order(ins)
                                                         if (r := _root(m, c)) is not None])
            elif op == "async-start" and ins.called and (r := _root(m, ins.called[0])) is not None:
                for idx in _indices(r.shape):  # a tuple's table is each instruction's own
                    if not r.shape.subshape(idx).is_tuple:
                        self._join("async", [(ins.name, (1,) + idx), (r.name, idx)])
            self._in_place(comp, ins)
        self._donation()

    def _in_place(self, comp: Computation, ins: Instruction) -> None:
        pairs: list[tuple[str, int, Index, Index]] = []
        if ins.opcode == "fusion" and ins.called:
            try:
                found = alias_rules.discovered_pairs(self.module, ins, self._alias_model)
            except (HarnessError, KeyError, IndexError, ValueError):
                found = []
            pairs += [("in-place", p.operand_index, p.operand_shape_index, p.output_index) for p in found]
        else:
            pairs += [("in-place", op, oi, out) for op, oi, out in alias_rules.op_in_place_pairs(ins, comp)]
        if "output_to_operand_aliasing" in ins.attr_text:
            pairs += [("output_to_operand_aliasing", op, oi, out) for out, op, oi in ins.output_to_operand_aliasing()]
        for op, out in instruction_pairs(ins) or ():
            pairs.append(("backend-aliasing", op, (), out))
        for rule, k, oi, out in pairs:
            if 0 <= k < len(ins.operands):
                self._join(rule, [(ins.name, out), self._operand(comp, ins.operands[k], oi)])

    def _donation(self) -> None:
        text = self.module.input_output_alias
        entry = self.module.entry
        params = {p.parameter_number: p for p in entry.instructions if p.opcode == "parameter"}
        for out, (num, pidx) in _io_alias(text):
            p = params.get(num)
            if p is not None:
                self._join("donation", [(entry.root.name, out), (p.name, pidx)])

    # ------------------------------------------------------------------ intervals

    def intervals(self) -> None:
        tl = self.tl
        entry = self.module.entry
        donated = {(n, i) for _, (n, i) in _io_alias(self.module.input_output_alias)}
        defined_here: dict[int, tuple[Computation, Instruction]] = {}
        for comp, ins in tl.order:
            for idx in _indices(ins.shape):
                vid = self.by_pos.get((ins.name, idx))
                if vid is not None:
                    defined_here[vid] = (comp, ins)
        ends: dict[int, int] = {}
        for vid, (comp, ins) in defined_here.items():
            t = tl.time[ins.name]
            span = tl.span[comp.name]
            v = self.values[vid]
            v.start = span[0] if ins.opcode == "parameter" else t
            end = span[1] if ins.is_root else t
            ctx = tl.async_context.get(comp.name)
            if ctx is not None:
                end = max(end, self._done_time(ctx))
                v.start = max(v.start, self._runs_from(comp.name))
            ends[vid] = max(end, v.start)
        # positions (a root position lives to its computation's end)
        for comp, ins in tl.order:
            t = tl.span[comp.name][1] if ins.is_root else tl.time[ins.name]
            for idx in _indices(ins.shape):
                for vid in self.at((ins.name, idx)):
                    if vid in ends and t > ends[vid]:
                        ends[vid] = t
        self._uses()
        for vid, end in ends.items():
            v = self.values[vid]
            comp, ins = defined_here[vid]
            if ins.opcode == "parameter" and comp is entry and (ins.parameter_number, v.v.index) not in donated:
                v.end = tl.end
            else:
                v.end = max([end] + [t for t, _ in v.uses])

    def _runs_from(self, comp_name: str) -> int:
        """An async computation's values are written no earlier than its async start, as XLA times
        them (flattened just before the start, they become live with it); one whose start takes no
        operands (libtpu's ``call-start()``) runs once an async-update has given them: no earlier
        than that update."""
        t = -1
        c = comp_name
        for _ in range(1000):
            start = self.tl.async_context.get(c)
            if start is None or c not in self.tl.caller:
                break
            t = max(t, self.tl.time.get(start, -1))
            update = self._deferred().get(start)
            if update is not None:
                t = max(t, self.tl.time.get(update.name, -1))
            c = self.tl.caller[c][1].name
        return t

    def _done_time(self, start_name: str) -> int:
        done = self._dones().get(start_name)
        return self.tl.time.get(done, -1) if done else -1

    def _dones(self) -> dict[str, str]:
        """async start -> its done (through async-updates)."""
        if not hasattr(self, "_done_cache"):
            out: dict[str, str] = {}
            for comp, ins in self.tl.order:
                if ins.opcode.endswith("-done") and ins.operands:
                    src = comp.operand(ins.operands[0])[0]
                    seen = 0
                    while src.opcode == "async-update" and src.operands and seen < 10_000:
                        src = comp.operand(src.operands[0])[0]
                        seen += 1
                    out[src.name] = ins.name
            self._done_cache = out
        return self._done_cache

    def _uses(self) -> None:
        tl = self.tl
        first: dict[Pos, int] = {}  # where a printed 'x#k' is read: before the first of its users
        for _, ins in tl.order:
            for ref in ins.operands:
                base, k = split_ref(ref)
                for j in range(1, len(k) + 1):
                    first.setdefault((base, k[:j]), tl.time[ins.name])
        for comp, ins in tl.order:
            if ins.opcode in ("tuple", "domain"):  # not a use; but a printed 'x#k' operand is a read
                for ref in ins.operands:             # of x's tuple table by a get-tuple-element
                    self._use_tuple_tables(ins, ref, first)
                continue
            use_t, read_t, real = self._use_times(comp, ins)
            top_only = ins.opcode in ("get-tuple-element", "copy")
            for ref in ins.operands:
                self._use_operand(comp, ins, ref, first, (use_t, read_t, real, top_only))

    def _use_times(self, comp: Computation, ins: Instruction) -> tuple[int, int, bool]:
        """(the use's time, -1: none; the read's time; whether it is a real read) of ``ins``'s operands."""
        tl = self.tl
        t = tl.time[ins.name]
        dones = self._dones()
        read_t = tl.time.get(dones.get(ins.name, ""), t)  # an async operation reads until its done
        real = ins.opcode not in _FORWARD or (ins.opcode == "async-update" and len(ins.operands) > 1)
        if ins.opcode == "async-update":
            read_t = tl.time.get(dones.get(self._chain_start(comp, ins).name, ""), t)
        use_t = t
        if ins.opcode == "while":
            body = self.module.by_name.get(_name_attr(ins, "body"))
            params = [p for p in body.instructions if p.opcode == "parameter"] if body else []
            use_t = tl.time.get(params[0].name, t) if params else t
        if ins.opcode == "call":
            use_t = -1
        return use_t, read_t, real

    def _use_operand(self, comp: Computation, ins: Instruction, ref: str, first: dict[Pos, int],
                     how: tuple[int, int, bool, bool]) -> None:
        use_t, read_t, real, top_only = how
        base, k = split_ref(ref)
        src = comp.by_name.get(base)
        if src is None:
            return
        self._use_tuple_tables(ins, ref, first)
        try:
            sub = src.shape.subshape(k)
        except IndexError:
            return
        for idx in ([()] if top_only else _indices(sub)):
            for vid in self.at((base, k + idx)):
                v = self.values[vid]
                if use_t >= 0:
                    v.uses.append((use_t, ins.name))
                if real and not (sub.subshape(idx).is_tuple):
                    v.reads.append((read_t, ins.name))

    def _use_tuple_tables(self, ins: Instruction, ref: str, first: dict[Pos, int]) -> None:
        """A printed 'x#1' is a get-tuple-element reading x's tuple table, one, before the first of
        its users."""
        base, k = split_ref(ref)
        t = self.tl.time[ins.name]
        for j in range(len(k)):
            gte_t = first.get((base, k[:j + 1]), t)
            for vid in self.at((base, k[:j])):
                self.values[vid].uses.append((gte_t, self.tl.at(gte_t)))

    # ------------------------------------------------------------------ the compiler's live range

    def normalized(self) -> dict[int, tuple[int, int]]:
        """Our intervals cut as the compiler cuts those of one buffer (each ends where the next starts)."""
        groups: dict[int, list[Value]] = {}
        for vid, v in self.values.items():
            if v.start >= 0:
                groups.setdefault(self.union.find(vid), []).append(v)
        out: dict[int, tuple[int, int]] = {}
        for vs in groups.values():
            vs.sort(key=lambda v: (v.start, v.end, v.v.id))
            ends = [v.end for v in vs]
            for i in range(len(vs) - 1):
                ends[i + 1] = max(ends[i], ends[i + 1])
                ends[i] = min(ends[i], vs[i + 1].start)
            for v, e in zip(vs, ends, strict=True):
                out[v.v.id] = (v.start, e)
        return out

    def compare(self, dump: LiveRangeDump) -> tuple[int, list[str]]:
        out = sequence_disagreements(dump, self.tl)
        m = time_map(dump, self.tl)
        ours = self.normalized()
        n = 0
        for (name, idx), (s, e) in dump.ranges.items():
            vid = self.by_pos.get((name, idx))
            label = name + "{" + ",".join(map(str, idx)) + "}"
            if vid is None:
                out.append(f"live range: {label} is in the compiler's live range but not in the buffer assignment")
                continue
            if vid not in ours:
                if name not in self._printed:  # an async op's wrapped computation, which the printer hides
                    self.unprinted.append(f"{label}: defined by {name}, which the module's text does not print "
                                          f"(compiler {s}-{e})")
                    continue
                out.append(f"live range: {label} ({s}-{e}) is defined outside our timeline")
                continue
            n += 1
            ms, me = m[min(s, len(m) - 1)], m[min(e, len(m) - 1)]
            if (ms, me) != ours[vid]:
                os_, oe = ours[vid]
                if _at(dump, e) not in self.tl.time and _at(dump, s) in self.tl.time and ms == os_ and oe >= me:
                    # the compiler's end is a get-tuple-element the text prints only as 'x#k': where it
                    # ran is not in the text (we put it before its first user)
                    self.unprinted.append(f"{label}: compiler ends at {_at(dump, e)} ({e}), ours at "
                                          f"{self.tl.at(oe)} ({oe})")
                    continue
                out.append(f"live range: {label}: compiler {s}-{e} ({_at(dump, s)} .. {_at(dump, e)}), "
                           f"ours {os_}-{oe} ({self.tl.at(os_)} .. {self.tl.at(oe)})")
        return n, out

    # ------------------------------------------------------------------ checks

    def _describe(self, v: Value) -> dict:
        return {"value": v.label, "interval": [v.start, v.end], "defined_by": self.tl.at(v.start),
                "last_at": self.tl.at(v.end), "source": self._source_of(v.v.name)}

    def _source_of(self, name: str) -> str:
        if not hasattr(self, "_src"):
            self._src: dict[str, str] = {}
            for _, ins in self.tl.order:
                m = _SOURCE.search(ins.attr_text)
                if m:
                    self._src[ins.name] = f"{m.group(1)}:{m.group(2)}"
                else:
                    o = _OP_NAME.search(ins.attr_text)
                    self._src[ins.name] = o.group(1) if o else ""
        return self._src.get(name, "")

    def _conflict(self, kind: str, a: Value, b: Value, why: str) -> Finding:
        lo = max(a.v.offset, b.v.offset)
        hi = min(a.v.offset + a.v.size, b.v.offset + b.v.size)
        da, db = self._describe(a), self._describe(b)
        second = "" if a is b else (f" and {b.label} live {b.start}-{b.end} ({db['defined_by']} .. "
                                    f"{db['last_at']}{', ' + db['source'] if db['source'] else ''})")
        msg = (f"{kind}: allocation {a.allocation} bytes [{lo}, {hi}) (color {a.v.color}): "
               f"{a.label} live {a.start}-{a.end} ({da['defined_by']} .. {da['last_at']}"
               f"{', ' + da['source'] if da['source'] else ''}){second}: {why}")
        return Finding(kind, msg, {"allocation": a.allocation, "bytes": [lo, hi], "color": a.v.color,
                                   "a": da, "b": db})

    def check_overlap(self, report: Report) -> None:
        by_alloc: dict[int, list[Value]] = {}
        for v in self.values.values():
            if v.start >= 0 and v.v.size > 0:
                by_alloc.setdefault(v.allocation, []).append(v)
        for vs in by_alloc.values():
            vs.sort(key=lambda v: (v.start, v.end))
            active: list[Value] = []
            for b in vs:
                active = [a for a in active if a.end >= b.start]
                for a in active:
                    if a.v.offset >= b.v.offset + b.v.size or b.v.offset >= a.v.offset + a.v.size:
                        continue
                    report.pairs_checked += 1
                    if self.union.find(a.v.id) == self.union.find(b.v.id):
                        continue
                    if self._reuses(a, b) or self._reuses(b, a) or self._exclusive(a, b):
                        continue
                    report.conflicts.append(self._conflict("overlap", a, b, "both live, not one buffer"))
                active.append(b)

    def _reuses(self, a: Value, b: Value) -> bool:
        """operand-reuse: b is written by the instruction that last reads a, over a's bytes."""
        if a.end != b.start or b.v.phi:
            return False
        writer = self.tl.at(b.start)
        return any(t == a.end and who == writer for t, who in a.uses)

    def _exclusive(self, a: Value, b: Value) -> bool:
        """Both defined inside different branches of one conditional (never both run)."""
        ca, cb = self._branch_of(a), self._branch_of(b)
        return ca is not None and cb is not None and ca[0] == cb[0] and ca[1] != cb[1]

    def _branch_of(self, v: Value) -> tuple[str, str] | None:
        for name, (s, e) in self._branch_spans():
            if s <= v.start and v.end <= e:
                return self.tl.caller[name][0].name, name
        return None

    def _branch_spans(self) -> list[tuple[str, tuple[int, int]]]:
        if not hasattr(self, "_branches"):
            self._branches = [(c, self.tl.span[c]) for c, (caller, _) in self.tl.caller.items()
                              if caller.opcode == "conditional" and c in self.tl.span]
        return self._branches

    def check_in_place(self, report: Report) -> None:
        entry_params = {p.name for p in self.module.entry.instructions if p.opcode == "parameter"}
        groups: dict[tuple[int, int], list[Value]] = {}
        for vid, v in self.values.items():
            if v.start >= 0:
                groups.setdefault((self.union.find(vid), v.allocation), []).append(v)
        for vs in groups.values():
            if len(vs) < 2:
                continue
            vs.sort(key=lambda v: (v.start, v.v.id))
            for b in vs:
                writer = self.tl.at(b.start)
                if not self._written(b):
                    continue
                for a in vs:
                    if a is b or a.start >= b.start or not _bytes_meet(a, b):
                        continue
                    late = [(t, who) for t, who in a.reads if t >= b.start and who != writer]
                    if late:
                        t, who = max(late)
                        kind = "donation" if a.v.name in entry_params else "in-place"
                        report.conflicts.append(self._conflict(
                            kind, a, b, f"{writer} writes {b.label} over {a.label} at {b.start}, "
                                        f"but {who} reads {a.label} at {t}"))

    def _written(self, v: Value) -> bool:
        """Whether the instruction defining ``v`` writes its bytes: not a parameter, not a phi, and not
        an aliased fusion output that only carries its operand through (:meth:`_carried`)."""
        return not (v.v.phi or self._is_parameter(v) or v.v.id in self._carried())

    def _carried(self) -> frozenset[int]:
        """Values at fusion outputs declared aliased to an operand (output_to_operand_aliasing) that the
        fusion passes through unwritten: the fused root holds the operand's own parameter at that index,
        or the root is libtpu's ``AsyncCollectiveStart`` marker and the parameter is only an all-gather's
        source (a collective reads its source). The buffer assignment gives them values of their own in
        the operand's buffer, but no byte of them is written."""
        if not hasattr(self, "_carried_cache"):
            out: set[int] = set()
            for _, ins in self.tl.order:
                if ins.opcode == "fusion" and ins.called and "output_to_operand_aliasing" in ins.attr_text:
                    fused = self.module.by_name.get(ins.called[0])
                    if fused is None:
                        continue
                    for idx, k, oi in ins.output_to_operand_aliasing():
                        if not oi and _passes_through(fused, idx, k) and (vid := self.by_pos.get((ins.name, idx))):
                            out.add(vid)
            self._carried_cache = frozenset(out)
        return self._carried_cache

    def _is_parameter(self, v: Value) -> bool:
        if not hasattr(self, "_params"):
            self._params = {ins.name for _, ins in self.tl.order if ins.opcode == "parameter"}
        return v.v.name in self._params

    def check_async(self, report: Report) -> None:
        tl = self.tl
        dones = self._dones()
        defs: list[list[Value]] = [[] for _ in range(tl.end)]
        reads: list[list[Value]] = [[] for _ in range(tl.end)]
        for v in self.values.values():
            if 0 <= v.start < tl.end and self._written(v):
                defs[v.start].append(v)
            for t, who in v.reads:
                if 0 <= t < tl.end and tl.at(t) == who:
                    reads[t].append(v)
        for comp, ins in tl.order:
            if ins.opcode in ASYNC_STARTS and ins.name in dones:
                report.async_windows += 1
                self._check_window(report, comp, ins, tl.time[dones[ins.name]], (defs, reads))
        for start, done in self._collective_fusions():
            report.async_windows += 1
            self._check_collective_window(report, start, done, (defs, reads))

    # libtpu's async collectives: a fusion whose root is the AsyncCollectiveStart custom-call starts
    # it, continuation fusions carry its buffers on (each output aliased to the operand it takes them
    # from), and a fusion whose root is AsyncCollectiveDone ends it.

    def _collective_fusions(self) -> list[tuple[Instruction, Instruction]]:
        """(start fusion, done fusion) of each libtpu async collective, paired through the buffers the
        done takes (their values are in the start's output buffers)."""
        owner: dict[int, Instruction] = {}  # buffer (union root) -> the start fusion whose output it is
        out = []
        for comp, ins in self.tl.order:
            marker = _fused_root_target(self.module, ins)
            if marker == "AsyncCollectiveStart":  # its written buffers (the source it carries may be shared)
                for idx in _indices(ins.shape):
                    for vid in self.at((ins.name, idx)):
                        if vid not in self._carried():
                            owner.setdefault(self.union.find(vid), ins)
            elif marker == "AsyncCollectiveDone":
                starts = {owner[g].name: owner[g] for ref in ins.operands for idx in _indices(_shape_of(comp, ref))
                          for vid in self.at(self._operand(comp, ref, idx))
                          if (g := self.union.find(vid)) in owner}
                if len(starts) == 1:
                    out.append((next(iter(starts.values())), ins))
        return out

    def _check_collective_window(self, report: Report, start: Instruction, done: Instruction,
                                 at: tuple[list[list[Value]], list[list[Value]]]) -> None:
        """Between a libtpu async collective's start and done fusions: only the fusions carrying its
        buffers on read what it writes (the gathered result, its flags), and no other instruction
        writes bytes of any of its buffers."""
        tl = self.tl
        defs, reads = at
        ts, td = tl.time[start.name], tl.time[done.name]
        carried = self._carried()
        mine = [self.values[vid] for idx in _indices(start.shape) for vid in self.at((start.name, idx))]
        groups = {self.union.find(v.v.id) for v in mine}
        in_flight = {self.union.find(v.v.id) for v in mine if v.v.id not in carried}
        held: dict[int, list[Value]] = {}  # allocation -> the values of the collective's buffers in it
        for v in self._members(groups):
            held.setdefault(v.allocation, []).append(v)
        for t in range(ts + 1, td):
            ins = tl.order[t][1]
            if self._carries(tl.order[t][0], ins, groups):
                continue
            for x in reads[t]:
                if self.union.find(x.v.id) in in_flight:
                    report.conflicts.append(self._conflict(
                        "async", x, x, f"{tl.at(t)} reads {x.label} at {t} while the async collective "
                                       f"{start.name} .. {done.name} ({ts}-{td}) writes it, before its done"))
            for x in defs[t]:
                if self.union.find(x.v.id) in groups:
                    continue
                for y in self._met(x, t, held.get(x.allocation, [])):
                    report.conflicts.append(self._conflict(
                        "async", y, x, f"{tl.at(t)} writes {x.label} at {t} while the async collective "
                                       f"{start.name} .. {done.name} ({ts}-{td}) holds those bytes"))

    def _members(self, groups: set[int]) -> list[Value]:
        """The values of the buffers ``groups`` (union roots)."""
        if not hasattr(self, "_members_cache"):
            by_root: dict[int, list[Value]] = {}
            for vid, v in self.values.items():
                by_root.setdefault(self.union.find(vid), []).append(v)
            self._members_cache = by_root
        return [v for g in groups for v in self._members_cache.get(g, [])]

    def _carries(self, comp: Computation, ins: Instruction, groups: set[int]) -> bool:
        """Whether ``ins`` carries one of the collective's buffers on: an output aliased to an operand
        whose value is in one of them (a continuation fusion), or the done itself."""
        if _fused_root_target(self.module, ins) == "AsyncCollectiveDone":
            return True
        if "output_to_operand_aliasing" not in ins.attr_text:
            return False
        for _, k, oi in ins.output_to_operand_aliasing():
            if k < len(ins.operands) and any(self.union.find(vid) in groups
                                             for vid in self.at(self._operand(comp, ins.operands[k], oi))):
                return True
        return False

    def _check_window(self, report: Report, comp: Computation, ins: Instruction, td: int,
                      at: tuple[list[list[Value]], list[list[Value]]]) -> None:
        """Between ``ins`` (an async start) and its done at ``td``: no other instruction writes bytes it
        reads or writes, nor reads bytes it writes (its own result included: that is read after the done)."""
        tl = self.tl
        defs, reads = at
        ts = tl.time[ins.name]
        inside = set(range(*tl.span[ins.called[0]])) if ins.called and ins.called[0] in tl.span else set()
        written = [self.values[vid] for idx in _indices(ins.shape) for vid in self.at((ins.name, idx))
                   if self.values[vid].start == ts]
        written += [v for t in inside for v in defs[t]]
        read = [self.values[vid] for ref in ins.operands for idx in _indices(_shape_of(comp, ref))
                for vid in self.at(self._operand(comp, ref, idx))]
        mine = {v.v.id for v in written + read}
        own = {v.v.id for v in written}
        w_alloc = {v.allocation for v in written}
        r_alloc = {v.allocation for v in read}
        for t in range(ts + 1, td):
            if t in inside or tl.order[t][1].opcode == "async-update":
                continue
            for x in defs[t]:
                if x.v.id not in mine and x.allocation in w_alloc | r_alloc:
                    for y in self._met(x, t, written + read):
                        what = "writes" if y in written else "reads"
                        report.conflicts.append(self._conflict(
                            "async", y, x, f"{tl.at(t)} writes {x.label} at {t} while {ins.name} "
                                           f"({ts}-{td}) {what} those bytes"))
            for x in reads[t]:
                if x.v.id in own:  # the operation's own result, read before its done
                    report.conflicts.append(self._conflict(
                        "async", x, x, f"{tl.at(t)} reads {x.label} at {t} while {ins.name} "
                                       f"({ts}-{td}) writes it, before its done"))
                elif x.v.id not in mine and x.allocation in w_alloc:
                    for y in self._met(x, t, written):
                        report.conflicts.append(self._conflict(
                            "async", y, x, f"{tl.at(t)} reads {x.label} at {t} while {ins.name} "
                                           f"({ts}-{td}) writes those bytes"))

    def _met(self, x: Value, t: int, ys: list[Value]) -> list[Value]:
        """The values of ``ys`` still live at ``t`` whose bytes meet ``x``'s, not of its buffer."""
        return [y for y in ys if y.end >= t and y.allocation == x.allocation and _bytes_meet(x, y)
                and self.union.find(x.v.id) != self.union.find(y.v.id)]


def _passes_through(fused: Computation, idx: Index, k: int) -> bool:
    """Whether fused computation ``fused`` returns its parameter ``k`` unwritten at output ``idx``."""
    params = [p for p in fused.instructions if p.opcode == "parameter" and p.parameter_number == k]
    if not params:
        return False
    node: Instruction | None = fused.root
    for i in idx:
        if node is None or node.opcode != "tuple" or i >= len(node.operands):
            break
        base, sub = split_ref(node.operands[i])
        node = fused.by_name.get(base) if not sub else None
    else:
        if node is not None and node.name == params[0].name:
            return True
    root = fused.root
    if root.opcode == "custom-call" and root.attrs.get("custom_call_target", "").strip('"') == "AsyncCollectiveStart" \
            and idx == (0,):
        readers = [u for u in fused.instructions if any(split_ref(o)[0] == params[0].name for o in u.operands)]
        return bool(readers) and all(u.opcode == "all-gather" for u in readers)
    return False


def _fused_root_target(module: HloModule, ins: Instruction) -> str:
    """The custom-call target at the root of fusion ``ins``'s computation ("" for anything else)."""
    if ins.opcode != "fusion" or not ins.called:
        return ""
    fused = module.by_name.get(ins.called[0])
    if fused is None or fused.root is None or fused.root.opcode != "custom-call":
        return ""
    return fused.root.attrs.get("custom_call_target", "").strip('"')


def _shape_of(comp: Computation, ref: str) -> Shape:
    base, k = split_ref(ref)
    try:
        return comp.by_name[base].shape.subshape(k)
    except (KeyError, IndexError):
        return Shape("token")


def _bytes_meet(a: Value, b: Value) -> bool:
    return a.allocation == b.allocation and a.v.offset < b.v.offset + b.v.size and b.v.offset < a.v.offset + a.v.size


def _name_attr(ins: Instruction, key: str) -> str:
    return ins.attrs.get(key, "").strip().lstrip("%")


def _at(dump: LiveRangeDump, t: int) -> str:
    return dump.sequence[t] if 0 <= t < len(dump.sequence) else "<end>"


_IO_ALIAS = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}")


def _io_alias(text: str) -> list[tuple[Index, tuple[int, Index]]]:
    def idx(s: str) -> Index:
        return tuple(int(x) for x in s.split(",") if x.strip())
    return [(idx(o), (int(p), idx(pi))) for o, p, pi in _IO_ALIAS.findall(text or "")]


# ----------------------------------------------------------------------------- files


def read_text(path: Path) -> str:
    """A dump file's text, gzip-compressed or not."""
    data = read_regular(path)
    if data[:2] == b"\x1f\x8b":
        data = gunzip(data, path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HarnessError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None


GUNZIP_CHUNK = 1 << 22  # bytes decompressed between two returns to the interpreter (where a signal acts)


def gunzip(data: bytes, path: Path) -> bytes:
    """``data`` decompressed a few MiB at a time, so Ctrl-C stops a large dump's read at once (one call
    of ``gzip.decompress`` holds the interpreter until the whole file is out)."""
    parts = []
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
            while chunk := fh.read(GUNZIP_CHUNK):
                parts.append(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise HarnessError(f"{path}: a broken gzip file ({exc})") from None
    return b"".join(parts)


def beside(module_path: Path, suffix: str) -> Path | None:
    """``X.txt[.gz]`` -> ``X-<suffix>.txt[.gz]`` when it exists."""
    name = module_path.name
    stem = name.removesuffix(".gz").removesuffix(".txt")
    for ext in (".txt", ".txt.gz"):
        p = module_path.with_name(f"{stem}-{suffix}{ext}")
        if p.is_file():
            return p
    return None


def backend_of(module: HloModule, path: str) -> str:
    if "aliasing_operands" in module.header_attrs or "tpu" in path.lower():
        return "tpu"
    if "_gpu_" in path or ".sm_" in path or "gpu" in path.lower():
        return "gpu"
    return "cpu"


def check_texts(hlo: str, ba_text: str, live_range: str | None = None, name: str = "<string>",
                backend: str = "", disabled: frozenset[str] = frozenset()) -> Report:
    t0 = time.perf_counter()
    module = parse_module(hlo, name)
    ba = parse_buffer_assignment(ba_text, name + " (buffer assignment)")
    return check_module(module, ba, live_range, name, backend, disabled, t0)


def check_module(module: HloModule, ba: BufferAssignment, live_range: str | None = None, name: str = "<string>",
                 backend: str = "", disabled: frozenset[str] = frozenset(), t0: float | None = None) -> Report:
    """memcheck of a parsed module and its buffer assignment (and the compiler's live-range text, where
    dumped); ``t0``: when the work began (the report's seconds count from there)."""
    t0 = time.perf_counter() if t0 is None else t0
    chk = Checker(module, ba, backend or backend_of(module, name), disabled)
    chk.dataflow()
    chk.group()
    chk.intervals()
    report = Report(name, values=len(chk.values), timed=sum(v.start >= 0 for v in chk.values.values()),
                    allocations=len(ba.allocations))
    if report.timed == 0:
        raise HarnessError(f"{name}: no value of the buffer assignment is defined in the module's schedule "
                           "(a buffer assignment of another module?)")
    chk.check_overlap(report)
    chk.check_in_place(report)
    chk.check_async(report)
    if live_range is not None:
        dump = parse_live_range(live_range, name + " (live range)")
        report.live_range_compared, report.disagreements = chk.compare(dump)
        report.unprinted_ends = chk.unprinted
    report.rules_used = dict(sorted(chk.rules_used.items()))
    report.aliasing_not_taken = chk.not_taken
    report.seconds = time.perf_counter() - t0
    return report


def check_files(module_path: Path) -> Report:
    ba = beside(module_path, "buffer-assignment")
    if ba is None:
        raise HarnessError(f"{module_path}: no buffer assignment beside it (…-buffer-assignment.txt)")
    lr = beside(module_path, "live-range")
    return check_texts(read_text(module_path), read_text(ba), read_text(lr) if lr else None, str(module_path))
