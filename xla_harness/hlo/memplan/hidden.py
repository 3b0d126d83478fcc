"""The values of async wrapped computations that a module's text hides, tied to their starts.

XLA prints an async start wrapping a collective as sugar (``all-reduce-start``, ``reduce-scatter-start``)
and omits the wrapped computation, yet its buffer assignment and live range keep the wrapped
instruction's values (``all-reduce.18.1``, the start's output ``{1}``). Left untied they are never
timed, and a race on their bytes goes unseen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xla_harness.hlo.buffers import BufferAssignment, BufferValue
from xla_harness.hlo.fidelity import array_bytes
from xla_harness.hlo.ir import HloModule, Instruction
from xla_harness.hlo.memplan.values import Pos
from xla_harness.hlo.shapes import Shape

_SUGAR_STARTS = {"all-reduce-start": "all-reduce", "all-gather-start": "all-gather",
                 "collective-permute-start": "collective-permute", "all-to-all-start": "all-to-all",
                 "reduce-scatter-start": "reduce-scatter", "ragged-all-to-all-start": "ragged-all-to-all",
                 "collective-broadcast-start": "collective-broadcast"}
_SUFFIX = re.compile(r"\.(\d+)$")


def _family(name: str) -> str:
    """``all-reduce.18.1`` -> ``all-reduce``: the opcode a hidden wrapped instruction is named after."""
    return name.split(".", 1)[0]


def _number(name: str) -> int:
    m = _SUFFIX.search(name)
    return int(m.group(1)) if m else -1


@dataclass(frozen=True)
class HiddenTies:
    """What :func:`tie_hidden_async_roots` found: ``positions`` (start, (1,) + index) -> value id of a
    hidden wrapped instruction's output; ``tables`` value id of a hidden tuple-shaped root's own tuple
    table -> its start (live from the start to its done, as XLA times it); ``untied`` hidden values
    that could not be tied."""

    positions: dict[Pos, int]
    tables: dict[int, str]
    untied: list[BufferValue]


def tie_hidden_async_roots(module: HloModule, ba: BufferAssignment, printed: set[str]) -> HiddenTies:
    """The values of async wrapped computations the module's text hides (an ``all-reduce-start`` printed
    as sugar for an async start wrapping ``all-reduce.18.1``), each tied to its start.

    The text names neither side of the tie. XLA creates a start's wrapped instruction with it, so per
    opcode the hidden instructions in value-id order and the starts that own no value at some output
    leaf ``{1, ...}`` in name-number order are the same sequence; each pair must also agree value by
    value on the byte sizes of the start's output (and its tuple table), or the opcode's values are
    left untied (and said so): never a guess."""
    hidden: dict[str, list[BufferValue]] = {}
    own: set[Pos] = set()
    for a in ba.allocations:
        for v in a.values:
            own.add((v.name, v.index))
            if v.name not in printed and not v.phi:
                hidden.setdefault(v.name, []).append(v)
    starts = _starts_without_outputs(module, own)
    by_family: dict[str, list[str]] = {}
    for name in hidden:
        by_family.setdefault(_family(name), []).append(name)
    ties = HiddenTies({}, {}, [])
    for fam, names in by_family.items():
        names.sort(key=lambda n: min(v.id for v in hidden[n]))
        cands = sorted(starts.get(fam, []), key=lambda i: _number(i.name))
        pairs = _pair(names, cands, hidden) if len(cands) == len(names) else None
        if pairs is not None:
            ties.positions.update(pairs.positions)
            ties.tables.update(pairs.tables)
        elif cands:  # values of an opcode no start of the module has are no async value here at all
            ties.untied.extend(v for n in names for v in hidden[n])
    return ties


def _starts_without_outputs(module: HloModule, own: set[Pos]) -> dict[str, list[Instruction]]:
    """Per opcode family, the async starts printed as sugar that own no value at some output leaf."""
    starts: dict[str, list[Instruction]] = {}
    for comp in module.computations:
        for ins in comp.instructions:
            # the opcode's own start, or an async-start the reader took from its sugar (reduce-scatter-start)
            fam = _SUGAR_STARTS.get(ins.opcode) or (ins.async_wrapped if ins.opcode == "async-start" else "")
            outs = ins.shape.tuple_shapes
            if fam and outs and len(outs) > 1 and any((ins.name, (1,) + i) not in own for i, _ in outs[1].leaves()):
                starts.setdefault(fam, []).append(ins)
    return starts


def _fits(shape: Shape, size: int) -> bool:
    """Whether a value of ``size`` bytes can be an array of ``shape``: exactly its bytes, or at least them
    where its layout is tiled (libtpu pads the tiled dimensions: bf16[1,4,1023,1024] takes 8388608)."""
    need = array_bytes(shape)
    return size == need or ("T(" in shape.layout_extra and need <= size)


def _pair(names: list[str], starts: list[Instruction], hidden: dict[str, list[BufferValue]]) -> HiddenTies | None:
    """The ties of hidden instructions ``names`` to ``starts`` in order, or None when a value's size
    does not fit its start's output."""
    out = HiddenTies({}, {}, [])
    for name, start in zip(names, starts, strict=True):
        output = (start.shape.tuple_shapes or ())[1]  # a start's outputs are its {1} (a tuple by selection)
        for v in hidden[name]:
            try:
                sub = output.subshape(v.index)
            except IndexError:
                return None
            if sub.tuple_shapes is not None:  # the wrapped root's own tuple table: a pointer per output
                if v.index or v.size != 8 * len(sub.tuple_shapes):
                    return None
                out.tables[v.id] = start.name
            elif _fits(sub, v.size):
                out.positions[(start.name, (1,) + v.index)] = v.id
            else:
                return None
    return out
