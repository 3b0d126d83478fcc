"""Read XLA's ``*buffer-assignment.txt`` (and, when dumped beside it,
``*buffer-assignment-values.txt``): say whether a hazard fusion's output shares an allocation with
the buffer feeding its in-place parameter, and which buffer slice the compiler gave each value.

The slices are the compiler's own in-place decision where it writes no aliasing field (the GPU and
CPU compilers): a fusion's in-place op writes into its operand's buffer only when the operand's
value and the fusion's output were given the same slice (allocation, offset, size); otherwise the
emitter copies the operand first. The values file's ``uses:`` lists name the value each operand of
each instruction reads (async-done, get-tuple-element and bitcast resolved by the compiler's own
dataflow); without it an operand's value is found by name, through bitcasts and
get-tuple-elements, or not at all.

Format read (as XLA prints it)::

    allocation 0: size 8192, parameter 0, shape |f32[64,32]| at ShapeIndex {}, maybe-live-out:
     value: <23 W.1 @0> (size=8192,offset=0): f32[64,32]{1,0}
     value: <30 wrapped_scatter @0> (size=8192,offset=0): f32[32,64]{1,0}

and of the values file::

    <1852 reduce-scatter.4.1 @0>
     positions:
      reduce-scatter.4.1
      reduce-scatter-done.2
     uses:
      input_scatter_fusion, operand 0
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.hlo.ir import split_ref
from xla_harness.runtime.files import read_regular

_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
# HloValue::ToShortString: '<id name{index} (phi) @color>', index only for tuple-shaped values
_VALUE = re.compile(r"^\s*value: <(\d+) ([^\s{@>]+)(\{[\d,\s]*\})?( \(phi\))?(?: @(\d+))?> "
                    r"\(size=(\d+),offset=(\d+)\)")
# the values file: a value's header line, and its "uses:" lines 'user, operand N {index}'
_VALUE_HEAD = re.compile(r"^<(\d+) ([^\s{@>]+)(\{[\d,\s]*\})?(?: \(phi\))?(?: @(\d+))?>\s*$")
_USE = re.compile(r"^  (\S+), operand (\d+)(?: (\{[\d,\s]*\}))?\s*$")


def _index(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in (text or "{}").strip("{}").split(",") if x.strip())


@dataclass(frozen=True)
class BufferValue:
    name: str
    index: tuple[int, ...]
    size: int
    offset: int
    id: int = -1  # the HloValue id (``<id name @color>``)
    color: int = 0  # the memory space (``@color``)
    phi: bool = False  # a phi value of the compiler's SSA dataflow (``(phi)``): written by no instruction


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
    # From the values file: (user, operand number, shape index) -> the id of the value it reads.
    uses: dict[tuple[str, int, tuple[int, ...]], int] | None = None
    # Lookups built when made (the allocations are not changed afterwards): value id -> (allocation,
    # offset, size); (name, index) -> the allocation and value listed first for it.
    by_id: dict[int, tuple[int, int, int]] = field(init=False, repr=False, compare=False)
    by_name: dict[tuple[str, tuple[int, ...]], tuple[Allocation, BufferValue]] = \
        field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.by_id = {v.id: (a.number, v.offset, v.size) for a in self.allocations for v in a.values}
        self.by_name = {}
        for a in self.allocations:
            for v in a.values:
                self.by_name.setdefault((v.name, v.index), (a, v))

    def slice_of_id(self, value_id: int) -> tuple[int, int, int] | None:
        """(allocation, offset, size) of the value with this id, None when no allocation holds it."""
        return self.by_id.get(value_id)

    def slice_of(self, name: str, index: tuple[int, ...] = ()) -> tuple[int, int, int] | None:
        """(allocation, offset, size) of the value ``name`` defines at ``index``."""
        found = self.find(name, index)
        return (found[0].number, found[1].offset, found[1].size) if found else None

    def find(self, name: str, index: tuple[int, ...] = ()) -> tuple[Allocation, BufferValue] | None:
        """The allocation and value ``name`` defines at ``index`` (the first listed), or None."""
        return self.by_name.get((name, index))


def parse_buffer_assignment(text: str, filename: str = "<string>") -> BufferAssignment:
    allocs: list[Allocation] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _ALLOC.match(line)
        if m:
            allocs.append(Allocation(int(m.group(1)), int(m.group(2)), m.group(3).strip(", ")))
            continue
        m = _VALUE.match(line)
        if m and allocs:
            allocs[-1].values.append(BufferValue(m.group(2), _index(m.group(3)), int(m.group(6)), int(m.group(7)),
                                                 int(m.group(1)), int(m.group(5) or 0), bool(m.group(4))))
        elif m:
            raise HarnessError(f"{filename}:{lineno}: value line before any allocation")
    if not allocs:
        raise HarnessError(f"{filename}:1: no 'allocation N:' lines: not a buffer-assignment file")
    return BufferAssignment(allocs, filename)


def parse_value_uses(text: str, filename: str = "<string>") -> dict[tuple[str, int, tuple[int, ...]], int]:
    """The values file's ``uses:`` lists: (user, operand number, shape index) -> value id."""
    uses: dict[tuple[str, int, tuple[int, ...]], int] = {}
    value = None
    in_uses = False
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _VALUE_HEAD.match(line)
        if m:
            value, in_uses = int(m.group(1)), False
        elif line.startswith(" uses:"):
            if value is None:
                raise HarnessError(f"{filename}:{lineno}: 'uses:' before any '<id name>' value line")
            in_uses = True
        elif line.startswith(" ") and not line.startswith("  "):
            in_uses = False  # ' positions:', ' from instruction: ...'
        elif in_uses and value is not None:
            u = _USE.match(line)
            if u:
                uses[(u.group(1), int(u.group(2)), _index(u.group(3)))] = value
    if value is None:
        raise HarnessError(f"{filename}:1: no '<id name @color>' lines: not a buffer-assignment values file")
    return uses


def values_path(ba_path: Path) -> Path:
    """``X-buffer-assignment.txt`` -> ``X-buffer-assignment-values.txt`` (XLA dumps both)."""
    return ba_path.with_name(ba_path.name[:-len(".txt")] + "-values.txt")


def load_buffer_assignment(path: Path | str) -> BufferAssignment:
    """Parse a buffer-assignment file, and the values file beside it when there is one; a FIFO,
    device, folder or a file past the size cap of ``read_regular`` is refused (HarnessError) rather
    than read (it could block or never end)."""
    path = Path(path)
    data = read_regular(path)  # its HarnessError names the path
    ba = parse_buffer_assignment(data.decode("utf-8", errors="replace"), str(path))
    values = values_path(path)
    if values.exists() or values.is_symlink():  # read_regular refuses one that is not a regular file
        ba.uses = parse_value_uses(read_regular(values).decode("utf-8", errors="replace"), str(values))
    return ba


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
