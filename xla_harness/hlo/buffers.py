"""Read XLA's ``*buffer-assignment.txt`` and say whether a hazard fusion's output shares an
allocation with the buffer feeding its in-place parameter.

Format read (as XLA prints it)::

    allocation 0: size 8192, parameter 0, shape |f32[64,32]| at ShapeIndex {}, maybe-live-out:
     value: <23 W.1 @0> (size=8192,offset=0): f32[64,32]{1,0}
     value: <30 wrapped_scatter @0> (size=8192,offset=0): f32[32,64]{1,0}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.files import read_regular
from xla_harness.hlo.ir import split_ref

_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
# HloValue::ToShortString: '<id name{index} (phi) @color>', index only for tuple-shaped values
_VALUE = re.compile(r"^\s*value: <(\d+) ([^\s{@>]+)(\{[\d,\s]*\})?(?: \(phi\))?(?: @(\d+))?> "
                    r"\(size=(\d+),offset=(\d+)\)")


@dataclass(frozen=True)
class BufferValue:
    name: str
    index: tuple[int, ...]
    size: int
    offset: int


@dataclass
class Allocation:
    number: int
    size: int
    attributes: str
    values: list[BufferValue] = field(default_factory=list)


@dataclass
class BufferAssignment:
    allocations: list[Allocation]
    filename: str = "<string>"

    def find(self, name: str, index: tuple[int, ...] = ()) -> tuple[Allocation, BufferValue] | None:
        for a in self.allocations:
            for v in a.values:
                if v.name == name and v.index == index:
                    return a, v
        return None


def parse_buffer_assignment(text: str, filename: str = "<string>") -> BufferAssignment:
    allocs: list[Allocation] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _ALLOC.match(line)
        if m:
            allocs.append(Allocation(int(m.group(1)), int(m.group(2)), m.group(3).strip(", ")))
            continue
        m = _VALUE.match(line)
        if m and allocs:
            idx = tuple(int(x) for x in (m.group(3) or "{}").strip("{}").split(",") if x.strip())
            allocs[-1].values.append(BufferValue(m.group(2), idx, int(m.group(5)), int(m.group(6))))
        elif m:
            raise HarnessError(f"{filename}:{lineno}: value line before any allocation")
    if not allocs:
        raise HarnessError(f"{filename}:1: no 'allocation N:' lines: not a buffer-assignment file")
    return BufferAssignment(allocs, filename)


def load_buffer_assignment(path: Path | str) -> BufferAssignment:
    """Parse a buffer-assignment file; a FIFO, device, folder or a file past the size cap of
    ``read_regular`` is refused (HarnessError) rather than read (it could block or never end)."""
    path = Path(path)
    data = read_regular(path)  # its HarnessError names the path
    return parse_buffer_assignment(data.decode("utf-8", errors="replace"), str(path))


@dataclass(frozen=True)
class SharedBuffer:
    fusion: str
    output_allocation: int | None
    source: str
    source_allocation: int | None
    shared: bool  # same allocation and overlapping byte ranges

    def sentence(self) -> str:
        if self.output_allocation is None or self.source_allocation is None:
            return f"{self.fusion}: buffer assignment does not list both {self.fusion} and {self.source}"
        verdict = "SHARE" if self.shared else "do not share"
        return (f"{self.fusion}: output in allocation {self.output_allocation}, its in-place source "
                f"{self.source} in allocation {self.source_allocation}: they {verdict} a buffer")


def compare(ba: BufferAssignment, fusion: str, output_index: tuple[int, ...], source: str) -> SharedBuffer:
    """Does the fusion's output share bytes with ``source`` ('name' or 'name#k', a tuple element)?"""
    out = ba.find(fusion, output_index) or ba.find(fusion)
    src = ba.find(*split_ref(source))
    shared = False
    if out and src and out[0].number == src[0].number:
        o, s = out[1], src[1]
        shared = o.offset < s.offset + s.size and s.offset < o.offset + o.size
    return SharedBuffer(fusion, out[0].number if out else None, source, src[0].number if src else None,
                        shared)
