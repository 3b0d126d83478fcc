"""The values memcheck works on: a buffer assignment's value with the interval the liveness stage
gives it, and the position types every stage shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from xla_harness.hlo.buffers import BufferValue
from xla_harness.hlo.shapes import Shape

Index = tuple[int, ...]
Pos = tuple[str, Index]  # (instruction name, shape index): a position of the module


@dataclass
class Value:
    """A buffer-assignment value (``v``) in allocation ``allocation``, timed by
    :func:`~xla_harness.hlo.memplan.liveness.liveness` (``start`` -1: not in the flattened schedule);
    ``reads`` are the (time, reader) of real reads, ``uses`` every use that keeps it live."""

    v: BufferValue
    allocation: int
    start: int = -1
    end: int = -1
    reads: list[tuple[int, str]] = field(default_factory=list)
    uses: list[tuple[int, str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        idx = "{" + ",".join(map(str, self.v.index)) + "}" if self.v.index else ""
        return f"{self.v.name}{idx}"


def indices(shape: Shape, prefix: Index = ()) -> list[Index]:
    """Every shape index of ``shape``, the tuple tables' included, in order."""
    stack = [(prefix, shape)]
    out: list[Index] = []
    while stack:
        index, s = stack.pop()
        out.append(index)
        if s.tuple_shapes is not None:
            stack.extend((index + (i,), sub) for i, sub in reversed(list(enumerate(s.tuple_shapes))))
    return out


def bytes_meet(a: Value, b: Value) -> bool:
    """Whether ``a`` and ``b`` share a byte of one allocation."""
    return a.allocation == b.allocation and a.v.offset < b.v.offset + b.v.size and b.v.offset < a.v.offset + a.v.size
