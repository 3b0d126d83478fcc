"""Our intervals held to the compiler's own live range (``*-live-range.txt``, where dumped): every
value the compiler times must be timed here, at the same times."""

from __future__ import annotations

from dataclasses import dataclass

from xla_harness.hlo.memplan.liveness import Liveness
from xla_harness.hlo.memplan.model import Plan
from xla_harness.hlo.memplan.rules import Buffers
from xla_harness.hlo.memplan.values import Value
from xla_harness.hlo.timeline import LiveRangeDump, sequence_disagreements, time_map


@dataclass(frozen=True)
class Comparison:
    compared: int  # values both time
    disagreements: list[str]
    unprinted_ends: list[str]  # ends at an instruction the text does not print (noted, not a disagreement)


def normalized(live: Liveness, buffers: Buffers) -> dict[int, tuple[int, int]]:
    """Our intervals cut as the compiler cuts those of one buffer (each ends where the next starts)."""
    groups: dict[int, list[Value]] = {}
    for vid, v in live.values.items():
        if v.start >= 0:
            groups.setdefault(buffers.of(vid), []).append(v)
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


def _at(dump: LiveRangeDump, t: int) -> str:
    return dump.sequence[t] if 0 <= t < len(dump.sequence) else "<end>"


def compare(plan: Plan, buffers: Buffers, live: Liveness, dump: LiveRangeDump) -> Comparison:
    tl = plan.tl
    out = sequence_disagreements(dump, tl)
    unprinted: list[str] = []
    m = time_map(dump, tl)
    ours = normalized(live, buffers)
    n = 0
    for (name, idx), (s, e) in dump.ranges.items():
        vid = plan.by_pos.get((name, idx))
        label = name + "{" + ",".join(map(str, idx)) + "}"
        if vid is None:
            out.append(f"live range: {label} is in the compiler's live range but not in the buffer assignment")
            continue
        if vid not in ours:
            if name not in plan.printed:  # an async op's wrapped computation, which the printer hides
                unprinted.append(f"{label} ({s}-{e}): defined by {name}, which the module's text does not print "
                                 "and memcheck could not tie to its async start: left out (hidden-untied)")
                continue
            out.append(f"live range: {label} ({s}-{e}) is defined outside our timeline")
            continue
        n += 1
        ms, me = m[min(s, len(m) - 1)], m[min(e, len(m) - 1)]
        if (ms, me) != ours[vid]:
            os_, oe = ours[vid]
            if _at(dump, e) not in tl.time and _at(dump, s) in tl.time and ms == os_ and oe >= me:
                # the compiler's end is a get-tuple-element the text prints only as 'x#k': where it
                # ran is not in the text (we put it before its first user)
                unprinted.append(f"{label}: compiler ends at {_at(dump, e)} ({e}), ours at {tl.at(oe)} ({oe})")
                continue
            out.append(f"live range: {label}: compiler {s}-{e} ({_at(dump, s)} .. {_at(dump, e)}), "
                       f"ours {os_}-{oe} ({tl.at(os_)} .. {tl.at(oe)})")
    return Comparison(n, out, unprinted)
