"""The schedule of a compiled module flattened into one timeline, as the compiler runs it, and the
compiler's own dumped timeline (``*-live-range.txt``) read for comparison.

Flattening: the entry computation's sequence in order; before a ``while`` its condition and then its
body, before a ``call`` or ``conditional`` the computations it calls (branches in order), before an
async start the computation it wraps; each computation once. A fusion's computation (and any
``to_apply`` of a reduce, sort, scatter, ...) runs inside its one instruction and is not flattened.
Time ``t`` is the instruction's position; a computation's span is ``[start, end)``.

The live-range file::

    HloLiveRange (max 41):
      InstructionSequence:
        0:x.1
      BufferLiveRange:
        x.1{}:0-8
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from xla_harness.errors import HarnessError
from xla_harness.hlo.ir import Computation, HloModule, Instruction

ASYNC_STARTS = ("async-start", "copy-start", "all-reduce-start", "all-gather-start", "collective-permute-start",
                "send", "recv")


def _name(text: str) -> str:
    return text.strip().lstrip("%")


def called_in_order(ins: Instruction) -> list[str]:
    """The computations ``ins`` runs as part of the schedule (not fusion bodies nor to_apply of
    reductions), in the order they are flattened."""
    op = ins.opcode
    if op == "while":
        return [_name(ins.attrs.get("condition", "")), _name(ins.attrs.get("body", ""))]
    if op == "conditional":
        branches = ins.attrs.get("branch_computations")
        if branches:
            return [_name(b) for b in branches.strip("{}").split(",") if b.strip()]
        return [_name(ins.attrs[k]) for k in ("true_computation", "false_computation") if k in ins.attrs]
    if op == "async-start" and "to_apply" in ins.attrs and "calls" not in ins.attrs:
        return []  # a natively-async op's sugar (reduce-scatter-start): its to_apply is its reducer, embedded
    if op == "call" or (op == "async-start" and ins.called):
        return list(ins.called)
    return []


@dataclass
class Timeline:
    order: list[tuple[Computation, Instruction]] = field(default_factory=list)
    time: dict[str, int] = field(default_factory=dict)  # instruction name -> time
    span: dict[str, tuple[int, int]] = field(default_factory=dict)  # computation -> [start, end)
    async_context: dict[str, str] = field(default_factory=dict)  # wrapped computation -> its async-start
    caller: dict[str, tuple[Instruction, Computation]] = field(default_factory=dict)  # computation -> caller

    @property
    def end(self) -> int:
        return len(self.order)

    def at(self, t: int) -> str:
        return self.order[t][1].name if 0 <= t < len(self.order) else "<end>"


def flatten(module: HloModule) -> Timeline:
    tl = Timeline()
    # explicit stack of (computation, next instruction index, async context) frames: no recursion
    stack: list[tuple[Computation, int, str]] = [(module.entry, 0, "")]
    tl.span[module.entry.name] = (0, 0)
    while stack:
        comp, i, ctx = stack.pop()
        if i >= len(comp.instructions):
            tl.span[comp.name] = (tl.span[comp.name][0], len(tl.order))
            continue
        ins = comp.instructions[i]
        pending = [c for c in called_in_order(ins) if c in module.by_name and c not in tl.span]
        if pending:
            stack.append((comp, i, ctx))  # come back to ins after its computations
            sub = module.by_name[pending[0]]
            sub_ctx = sub.name if ins.opcode == "async-start" else ctx
            if sub_ctx:
                tl.async_context[sub.name] = ins.name if ins.opcode == "async-start" else tl.async_context[ctx]
            tl.caller[sub.name] = (ins, comp)
            tl.span[sub.name] = (len(tl.order), len(tl.order))
            stack.append((sub, 0, sub_ctx))
            continue
        for c in called_in_order(ins):  # already flattened by an earlier caller: still record this one
            tl.caller.setdefault(c, (ins, comp))
        tl.time[ins.name] = len(tl.order)
        tl.order.append((comp, ins))
        stack.append((comp, i + 1, ctx))
    return tl


# ----------------------------------------------------------------------------- the compiler's live range

_RANGE = re.compile(r"^\s+(\S+?)(\{[\d,\s]*\}):(\d+)-(\d+)\s*$")
_SEQ = re.compile(r"^\s+(\d+):(\S+)\s*$")


@dataclass
class LiveRangeDump:
    sequence: list[str]
    ranges: dict[tuple[str, tuple[int, ...]], tuple[int, int]]
    max_time: int


def parse_live_range(text: str, filename: str = "<string>") -> LiveRangeDump:
    seq: list[str] = []
    ranges: dict[tuple[str, tuple[int, ...]], tuple[int, int]] = {}
    section = ""
    max_time = -1
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("HloLiveRange (max "):
            max_time = int(line.split("max ")[1].rstrip("):\n "))
            continue
        head = line.strip()
        if head in ("InstructionSequence:", "BufferLiveRange:"):
            section = head
            continue
        if head.startswith("Live ranges at"):
            break
        if section == "InstructionSequence:":
            m = _SEQ.match(line)
            if m is None:
                raise HarnessError(f"{filename}:{lineno}: expected 'N:name' in the instruction sequence")
            if int(m.group(1)) != len(seq):
                raise HarnessError(f"{filename}:{lineno}: instruction {m.group(1)} out of order")
            seq.append(m.group(2))
        elif section == "BufferLiveRange:":
            m = _RANGE.match(line)
            if m is None:
                raise HarnessError(f"{filename}:{lineno}: expected 'name{{index}}:start-end'")
            idx = tuple(int(x) for x in m.group(2).strip("{}").split(",") if x.strip())
            ranges[(m.group(1), idx)] = (int(m.group(3)), int(m.group(4)))
    if max_time < 0 or not seq:
        raise HarnessError(f"{filename}:1: no 'HloLiveRange (max N):' with an instruction sequence: "
                           "not a live-range dump")
    return LiveRangeDump(seq, ranges, max_time)


def time_map(dump: LiveRangeDump, tl: Timeline) -> list[int]:
    """The compiler's time -> ours: an instruction we do not print (a get-tuple-element written as
    ``x#1``) takes the time of the next one we do; the end maps to the end."""
    out = [tl.end] * (len(dump.sequence) + 1)
    nxt = tl.end
    for i in range(len(dump.sequence) - 1, -1, -1):
        t = tl.time.get(dump.sequence[i])
        if t is not None:
            nxt = t
        out[i] = nxt
    return out


def sequence_disagreements(dump: LiveRangeDump, tl: Timeline) -> list[str]:
    """Instructions of our timeline missing from the compiler's, or in another order."""
    theirs = {n: i for i, n in enumerate(dump.sequence)}
    out = []
    last = -1
    last_name = ""
    for _, ins in tl.order:
        i = theirs.get(ins.name)
        if i is None:
            out.append(f"schedule: {ins.name} (our time {tl.time[ins.name]}) is not in the compiler's sequence")
            continue
        if i < last:
            out.append(f"schedule: {ins.name} is at compiler time {i}, before {last_name} ({last}); "
                       f"ours puts it after")
        else:
            last, last_name = i, ins.name
    return out
