"""Races planted in a real dump and judged by the compiler's own live range, never by memcheck: a value
with bytes of its own is moved onto another value's bytes; the move is a race when XLA's live range
has the moved value live at once with any value already on those bytes (strictly overlapping
intervals), harmless when it has none live at once. Moves whose intervals only touch (one ends
where the other starts: an operand reused by the instruction that last reads it) are not drawn."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from xla_harness.hlo.buffers import parse_buffer_assignment
from xla_harness.hlo.timeline import LiveRangeDump

_VALUE = re.compile(r"^ value: <(\d+) ([^\s{@>]+)(\{[\d,\s]*\})?( \(phi\))?(?: @(\d+))?> \(size=(\d+),offset=(\d+)\)",
                    re.M)


@dataclass(frozen=True)
class Move:
    """``victim`` moved to ``offset`` of ``allocation`` (where ``onto`` lies): a race per XLA's live range
    when ``race``, with ``met`` the values there live at once with it."""

    victim: str  # label, e.g. all-gather-start.7{}
    onto: str
    allocation: int
    offset: int
    race: bool
    met: tuple[str, ...]
    text: str  # the buffer assignment with the move made


def _label(name: str, index: tuple[int, ...]) -> str:
    return name + "{" + ",".join(map(str, index)) + "}"


def moves(ba_text: str, dump: LiveRangeDump, seed: int, races: int, harmless: int) -> Iterator[Move]:
    """``races`` planted races and ``harmless`` harmless moves, drawn with ``seed`` from the values XLA's
    live range times (same memory space, the victim fitting in the target's allocation)."""
    ba = parse_buffer_assignment(ba_text)
    where: dict[int, tuple[int, int, int, int]] = {}  # id -> (allocation, offset, size, color)
    label: dict[int, str] = {}
    for a in ba.allocations:
        if "thread-local" in a.attributes:
            continue
        for v in a.values:
            if v.size > 0 and not v.phi and (v.name, v.index) in dump.ranges:
                where[v.id] = (a.number, v.offset, v.size, v.color)
                label[v.id] = _label(v.name, v.index)
    sizes = {a.number: a.size for a in ba.allocations}
    by_alloc: dict[int, list[int]] = {}
    for vid, (alloc, _, _, _) in where.items():
        by_alloc.setdefault(alloc, []).append(vid)
    interval = {vid: dump.ranges[_name_index(label[vid])] for vid in where}
    rng = random.Random(seed)
    ids = sorted(where)
    want = {True: races, False: harmless}
    seen: set[tuple[int, int, int]] = set()
    tries = 0
    while (want[True] or want[False]) and tries < 200_000:
        tries += 1
        victim, onto = rng.choice(ids), rng.choice(ids)
        va, vo, vs, vc = where[victim]
        ta, to, _, tc = where[onto]
        if victim == onto or va == ta or vc != tc or to + vs > sizes[ta] or (victim, ta, to) in seen:
            continue
        met, touch = _met(interval[victim], [(label[o], interval[o]) for o in by_alloc[ta]
                                             if where[o][1] < to + vs and to < where[o][1] + where[o][2]])
        race = bool(met)
        if touch or not want[race]:
            continue
        want[race] -= 1
        seen.add((victim, ta, to))
        yield Move(label[victim], label[onto], ta, to, race, tuple(sorted(met)),
                   move_value(ba_text, victim, ta, to))


def _met(live: tuple[int, int], there: list[tuple[str, tuple[int, int]]]) -> tuple[list[str], bool]:
    """The values ``there`` live at once with ``live`` (strictly overlapping), and whether one only
    touches it (one ends where the other starts)."""
    s, e = live
    met = [name for name, (s2, e2) in there if max(s, s2) < min(e, e2)]
    return met, any(max(s, s2) == min(e, e2) for _, (s2, e2) in there)


def _name_index(label: str) -> tuple[str, tuple[int, ...]]:
    name, idx = label[:-1].split("{", 1)
    return name, tuple(int(x) for x in idx.split(",") if x)


def move_value(ba_text: str, vid: int, allocation: int, offset: int) -> str:
    """The buffer assignment with value ``vid``'s line moved into ``allocation`` at ``offset``."""
    line = re.search(rf"^ value: <{vid} [^\n]*\n", ba_text, re.M)
    head = re.search(rf"^allocation {allocation}: [^\n]*\n", ba_text, re.M)
    if line is None or head is None:
        raise ValueError(f"no value {vid} or allocation {allocation}")
    moved = re.sub(r"offset=\d+", f"offset={offset}", line.group(0), count=1)
    text = ba_text[:line.start()] + ba_text[line.end():]
    head = re.search(rf"^allocation {allocation}: [^\n]*\n", text, re.M)
    assert head is not None
    return text[:head.end()] + moved + text[head.end():]
