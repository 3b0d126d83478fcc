"""The HLO module as plain dataclasses: :class:`HloModule`, :class:`Computation`,
:class:`Instruction` (attributes read on demand), operand references (``name#i#j``) and
``output_to_operand_aliasing``. Built by :mod:`xla_harness.hlo.parser`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from xla_harness.errors import HarnessError
from xla_harness.hlo.lexer import split_top
from xla_harness.hlo.shapes import Shape


@dataclass
class Instruction:
    name: str
    shape: Shape
    opcode: str
    operands: list[str]
    attr_text: str = ""  # everything after the operand list, parsed into ``attrs`` on demand
    is_root: bool = False
    line: int = 0
    literal: str = ""  # operand text of constant/parameter/iota-like opcodes

    called: list[str] = field(default_factory=list)  # computations called (calls=, to_apply=, ...)
    async_wrapped: str = ""  # 'call' for the sugar 'call-start' (opcode then 'async-start')

    @functools.cached_property
    def attrs(self) -> dict[str, str]:
        """Attributes as key -> raw value text (``dimensions`` -> ``{1,0}``)."""
        out: dict[str, str] = {}
        rest = self.attr_text.strip()
        if rest.startswith(","):
            rest = rest[1:]
        if rest:
            for part in split_top(rest):
                key, eq, value = part.partition("=")
                if eq:
                    out[key.strip()] = value.strip()
        return out

    @property
    def parameter_number(self) -> int:
        return int(self.literal)

    @property
    def fusion_kind(self) -> str | None:
        return self.attrs.get("kind")

    def int_list(self, key: str) -> tuple[int, ...]:
        """``dimensions={1,0}`` -> (1, 0); a direct search when the key occurs once."""
        t = self.attr_text
        k = t.find(key + "={")
        i = k - 1
        while i > 0 and t[i] in " \t\n":
            i -= 1
        if k > 0 and t[i] == "," and t.count(key + "=") == 1:  # the attribute, once, not inside a string
            j = k + len(key) + 2
            e = t.find("}", j)
            body = t[j:e]
            if e > 0 and body.replace(",", "").isdigit():
                return tuple(map(int, body.split(",")))
        found = re.findall(rf"(?:^|,)\s*{re.escape(key)}\s*=\s*\{{([\d,\s]*)\}}", self.attr_text)
        if len(found) == 1 and self.attr_text.count(key + "=") == 1:
            return tuple(int(x) for x in found[0].split(",") if x.strip())
        v = self.attrs.get(key, "").strip().strip("{}")
        return tuple(int(x) for x in v.split(",") if x.strip())

    def output_to_operand_aliasing(self) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
        """[(output index, operand number, operand shape index)] from the attribute."""
        return parse_output_to_operand_aliasing(self.attrs.get("output_to_operand_aliasing", ""))


def split_ref(ref: str) -> tuple[str, tuple[int, ...]]:
    """'p#1#0' -> ('p', (1, 0)): the instruction named and the tuple index selected."""
    if "#" not in ref:
        return ref, ()
    base, *idx = ref.split("#")
    return base, tuple(int(k) for k in idx)


@dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False
    line: int = 0
    execution_thread: str = ""
    by_name: dict[str, Instruction] = field(default_factory=dict)
    # the ROOT instruction, or the last one when none is marked (as in XLA); set when made
    root: Instruction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.by_name:
            self.by_name = {ins.name: ins for ins in self.instructions}
        for ins in self.instructions:
            if ins.is_root:
                self.root = ins
                break
        else:
            if self.instructions:
                self.root = self.instructions[-1]

    def operand(self, ref: str) -> tuple[Instruction, tuple[int, ...]]:
        """The instruction an operand reference names, and the tuple index of ``name#k``
        (newer XLA prints tuple elements this way instead of a get-tuple-element)."""
        base, index = split_ref(ref)
        return self.by_name[base], index



def users_index(comp: Computation) -> dict[str, list[Instruction]]:
    """Instruction name -> the instructions of ``comp`` using it as an operand, in order, each user
    once however many operands it takes (``name#k`` is a use of ``name``); one pass over the
    computation, so a caller asking about many names builds it once and keeps it."""
    index: dict[str, list[Instruction]] = {}
    for ins in comp.instructions:
        for op in ins.operands:
            base = op.partition("#")[0] if "#" in op else op
            users = index.get(base)
            if users is None:
                index[base] = [ins]
            elif users[-1] is not ins:  # each user once, however many operands it takes
                users.append(ins)
    return index


@dataclass
class HloModule:
    name: str
    computations: list[Computation]
    input_output_alias: str = ""
    filename: str = "<string>"
    by_name: dict[str, Computation] = field(default_factory=dict)
    header_attrs: str = ""  # the module header's attribute text as printed
    # FileNames / FunctionNames / FileLocations / StackFrames as printed before the computations
    # (what an instruction's metadata stack_frame_id points into); "" when the dump has none.
    source_tables: str = ""

    def __post_init__(self) -> None:
        self.by_name = {c.name: c for c in self.computations}

    @property
    def entry(self) -> Computation:
        for c in self.computations:
            if c.is_entry:
                return c
        return self.computations[-1]

    def computation(self, name: str) -> Computation:
        try:
            return self.by_name[name]
        except KeyError:
            raise HarnessError(f"{self.filename}: module {self.name} has no computation {name!r}") from None

    def instruction_count(self) -> int:
        return sum(len(c.instructions) for c in self.computations)


_IDX = r"\{\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\}"
_OTOA_ONE = re.compile(rf"\s*({_IDX})\s*:\s*\(\s*(-?\d+)\s*,\s*({_IDX})\s*\)\s*")
_OTOA_RE = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(-?\d+)\s*,\s*\{([\d,\s]*)\}")


def _index(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip("{} ").split(",") if x.strip())


def parse_output_to_operand_aliasing(text: str) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
    return [(_index(a), int(b), _index(c)) for a, b, c in _OTOA_RE.findall(text)]


def check_output_to_operand_aliasing(text: str) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
    """Strict reading of ``{{out}: (operand, {index}), ...}``; ValueError when malformed."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"malformed output_to_operand_aliasing {text[:60]!r}")
    body = body[1:-1]
    pairs = []
    if body.strip():
        for part in split_top(body):
            m = _OTOA_ONE.fullmatch(part)
            if m is None:
                raise ValueError(f"malformed output_to_operand_aliasing entry {part.strip()[:60]!r}")
            pairs.append((_index(m.group(1)), int(m.group(2)), _index(m.group(3))))
    return pairs
