"""Parse HLO text as XLA tools print it into plain dataclasses.

Reads ``compiled.as_text()`` / ``lowered.as_text(dialect="hlo")`` from jax and the files of
``--xla_dump_to`` (``*after_optimizations.txt`` and friends): operands printed with or
without their shapes, names with or without ``%``, nested tuple shapes, layouts with tiles
and memory spaces (``{1,0:T(8,128)S(1)}``), attribute values with nested braces, quoted
strings with escapes, and very long lines. Unknown opcodes are kept as they are.

Lines are handled with regular expressions plus a bracket scanner that jumps between
special characters, so a 100k-instruction module parses in about a second.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError


class HloParseError(HarnessError):
    """HLO text that cannot be read; the message names the file and line."""


# ----------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """An array shape (element type, dims, layout) or a tuple of shapes."""

    element_type: str
    dims: tuple[int, ...] = ()
    minor_to_major: tuple[int, ...] | None = None  # None: no layout printed
    tuple_shapes: tuple[Shape, ...] | None = None
    layout_extra: str = ""  # tiles, memory space etc. as printed after ':'

    @property
    def is_tuple(self) -> bool:
        return self.tuple_shapes is not None

    def subshape(self, index: tuple[int, ...]) -> Shape:
        s = self
        for i in index:
            if not s.is_tuple or i >= len(s.tuple_shapes):
                raise IndexError(f"shape index {index} out of range")
            s = s.tuple_shapes[i]
        return s

    def leaves(self, prefix: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Shape]]:
        """(shape index, array shape) of every leaf, in order."""
        if not self.is_tuple:
            return [(prefix, self)]
        out: list[tuple[tuple[int, ...], Shape]] = []
        for i, s in enumerate(self.tuple_shapes):
            out.extend(s.leaves(prefix + (i,)))
        return out

    def layout_or_default(self) -> tuple[int, ...]:
        """minor_to_major, or XLA's default descending layout when none was printed."""
        if self.minor_to_major is not None:
            return self.minor_to_major
        return tuple(range(len(self.dims) - 1, -1, -1))

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        dims = ",".join(str(d) for d in self.dims)
        lay = ""
        if self.minor_to_major is not None:
            lay = "{" + ",".join(str(d) for d in self.minor_to_major) + (
                ":" + self.layout_extra if self.layout_extra else "") + "}"
        return f"{self.element_type}[{dims}]{lay}"


_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_DIM_RE = re.compile(r"<?=?(\d+|\?)")


_BRACKETS = re.compile(r'[{}()\[\]"]')
# An array shape with an optional layout (no nested braces inside a layout), in one match.
_ARRAY_FAST = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](?:\{([^}:]*)(?::([^}]*))?\})?")


def _match_brace(text: str, i: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket closing the one at text[i] (quotes respected)."""
    depth = 0
    n = len(text)
    pat = _BRACKETS
    while i < n:
        m = pat.search(text, i)
        if m is None:
            break
        ch = m.group()
        i = m.end()
        if ch == '"':
            i = _skip_string(text, i)
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced '{open_ch}'")


_STR_END = re.compile(r'\\.|"')


def _skip_string(text: str, i: int) -> int:
    """Index just past the closing quote of a string whose body starts at i."""
    while True:
        m = _STR_END.search(text, i)
        if m is None:
            raise ValueError("unterminated string")
        if m.group() == '"':
            return m.end()
        i = m.end()


def parse_shape(text: str, i: int = 0) -> tuple[Shape, int]:
    """Parse a shape starting at text[i]; return it and the index after it."""
    while i < len(text) and text[i] == " ":
        i += 1
    if text.startswith("(", i):
        i += 1
        subs: list[Shape] = []
        while True:
            while text[i] == " ":
                i += 1
            if text[i] == ")":
                return Shape("tuple", tuple_shapes=tuple(subs)), i + 1
            s, i = parse_shape(text, i)
            subs.append(s)
            while text[i] == " ":
                i += 1
            if text[i] == ",":
                i += 1
            elif text[i] != ")":
                raise ValueError(f"bad tuple shape near {text[i:i + 20]!r}")
    m = _ARRAY_FAST.match(text, i)
    if m is None:
        raise ValueError(f"expected a shape near {text[i:i + 30]!r}")
    etype, dims_text, main, extra = m.groups()
    if dims_text.isdigit():
        dims: tuple[int, ...] = (int(dims_text),)
    elif not dims_text:
        dims = ()
    else:
        dims = tuple(int(d) if d != "?" else -1 for d in _DIM_RE.findall(dims_text))
    m2m = None
    if main is not None:
        main = main.strip()
        m2m = tuple(int(x) for x in main.split(",")) if main else ()
    return Shape(etype, dims, m2m, None, extra or ""), m.end()


# ----------------------------------------------------------------------------- instructions


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

    @functools.cached_property
    def attrs(self) -> dict[str, str]:
        """Attributes as key -> raw value text (``dimensions`` -> ``{1,0}``)."""
        out: dict[str, str] = {}
        rest = self.attr_text.strip()
        if rest.startswith(","):
            rest = rest[1:]
        if rest:
            for part in _split_top(rest):
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
        v = self.attrs.get(key, "").strip().strip("{}")
        return tuple(int(x) for x in v.split(",") if x.strip())

    def output_to_operand_aliasing(self) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
        """[(output index, operand number, operand shape index)] from the attribute."""
        return parse_output_to_operand_aliasing(self.attrs.get("output_to_operand_aliasing", ""))


@dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False
    line: int = 0
    by_name: dict[str, Instruction] = field(default_factory=dict)
    _users: dict[str, list[Instruction]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.by_name = {ins.name: ins for ins in self.instructions}

    @property
    def root(self) -> Instruction:
        for ins in self.instructions:
            if ins.is_root:
                return ins
        return self.instructions[-1]

    def operand(self, ref: str) -> tuple[Instruction, tuple[int, ...]]:
        """The instruction an operand reference names, and the tuple index of ``name#k``
        (newer XLA prints tuple elements this way instead of a get-tuple-element)."""
        base, sep, k = ref.partition("#")
        return self.by_name[base], ((int(k),) if sep else ())

    def users(self, name: str) -> list[Instruction]:
        """Instructions using ``name`` as an operand (index built on first use)."""
        if self._users is None:
            index: dict[str, list[Instruction]] = {}
            for ins in self.instructions:
                for op in dict.fromkeys(o.partition("#")[0] for o in ins.operands):
                    index.setdefault(op, []).append(ins)
            self._users = index
        return self._users.get(name, [])


@dataclass
class HloModule:
    name: str
    computations: list[Computation]
    input_output_alias: str = ""
    filename: str = "<string>"
    by_name: dict[str, Computation] = field(default_factory=dict)

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


_OTOA_RE = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}")


def _index(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_output_to_operand_aliasing(text: str) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
    return [(_index(a), int(b), _index(c)) for a, b, c in _OTOA_RE.findall(text)]


_INSTR_HEAD = re.compile(r"\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([A-Za-z][\w\-]*)\(")
_SPECIAL = re.compile(r'[{}()\[\]",]')
_CALL_RE = re.compile(r"(?<![\w.])(calls|to_apply|body|condition|true_computation|false_computation|"
                      r"branch_computations|called_computations)=(\{[^}]*\}|%?[^\s,{}]+)")
_LITERAL_OPCODES = {"constant", "parameter", "iota", "rng-bit-generator-state"}
_PCT_NAME = re.compile(r"%([^\s,()%{}]+)")
_OPERAND_NAME = re.compile(r"%?([^\s,()%]+)\s*$")


def _split_top(text: str) -> list[str]:
    """Split at commas not nested in brackets or strings."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while True:
        m = _SPECIAL.search(text, i)
        if m is None:
            break
        ch = m.group()
        i = m.end()
        if ch == '"':
            i = _skip_string(text, i)
        elif ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i - 1])
            start = i
    tail = text[start:]
    if tail.strip():
        parts.append(tail)
    return parts


def _operand_name(text: str) -> str:
    """'f32[2]{0} %a' / '%a' / 'a' -> 'a'."""
    text = text.strip()
    m = _OPERAND_NAME.search(text)
    if m is None:
        raise ValueError(f"bad operand {text!r}")
    return m.group(1)


def parse_instruction(line: str, lineno: int = 0) -> Instruction:
    m = _INSTR_HEAD.match(line)
    if m is None:
        raise ValueError("expected 'name = shape opcode(operands)'")
    is_root, name = bool(m.group(1)), m.group(2)
    shape, i = parse_shape(line, m.end())
    m = _OPCODE.match(line, i)
    if m is None:
        raise ValueError(f"expected an opcode near {line[i:i + 30]!r}")
    opcode = m.group(1)
    open_at = m.end() - 1
    j = line.find(")", open_at)
    inner = line[open_at + 1:j] if j > 0 else ""
    if j > 0 and "(" not in inner and '"' not in inner:
        close = j + 1  # the common case: no nested parentheses in the operand list
    else:
        close = _match_brace(line, open_at, "(", ")")
        inner = line[open_at + 1:close - 1]
    literal = ""
    if opcode in _LITERAL_OPCODES:
        operands = []
        literal = inner.strip()
    else:
        if not inner.strip():
            operands = []
        elif ("%" in inner and "(" not in inner and '"' not in inner
              and inner.count("%") == inner.count(",") + 1):
            operands = _PCT_NAME.findall(inner)  # every operand is '%a' or 'f32[2]{0} %a'
        elif "[" in inner or "(" in inner or "{" in inner or '"' in inner:
            operands = [_operand_name(p) for p in _split_top(inner)]
        else:  # untyped operands: 'a, b' or '%a, %b'
            operands = [p.strip().lstrip("%") for p in inner.split(",")]
    rest = line[close:]
    called = []
    if "=" in rest:
        for m in _CALL_RE.finditer(rest):
            called.extend(n.strip().lstrip("%") for n in m.group(2).strip("{}").split(",") if n.strip())
    return Instruction(name, shape, opcode, operands, rest, is_root, lineno, literal, called)


# ----------------------------------------------------------------------------- modules


_MODULE_RE = re.compile(r"\s*HloModule\s+([^\s,]+)")
_COMP_RE = re.compile(r"\s*(ENTRY\s+)?%?([^\s({]+)\s*(\(.*\)\s*->\s*.*)?\{\s*$")
_COMMENT = re.compile(r"^\s*(//|#)")
_INLINE_COMMENT = re.compile(r"/\*.*?\*/")
# Newer XLA prints stack-frame tables between the module header and the computations.
# A computation ends with '}', optionally followed by ', execution_thread="..."' (computations of
# other threads) or a '// name' comment (GPU profiler annotations).
_COMP_END = re.compile(r'^\}\s*(?:,\s*execution_thread\s*=\s*"[^"]*"\s*)?(?://.*)?$')
_SECTION = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\s*$")


def parse_module(text: str, filename: str = "<string>") -> HloModule:
    """Parse one HLO module; raise HloParseError naming file and line on malformed text."""
    modules = parse_modules(text, filename)
    if len(modules) != 1:
        raise HloParseError(f"{filename}: expected one HloModule, found {len(modules)}")
    return modules[0]


def parse_modules(text: str, filename: str = "<string>") -> list[HloModule]:
    """Parse every HloModule in the text (a file usually holds one)."""
    if not text.strip():
        raise HloParseError(f"{filename}:1: empty file, no HloModule")
    modules: list[HloModule] = []
    name: str | None = None
    io_alias = ""
    comps: list[Computation] = []
    cur: list[Instruction] | None = None
    cur_name, cur_entry, cur_line = "", False, 0
    lines = text.splitlines()
    last_line = max((i for i, ln in enumerate(lines, 1) if ln.strip()), default=0)
    in_section = False
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            in_section = False
            continue
        if _COMMENT.match(line):
            continue
        if "/*" in line:
            line = _INLINE_COMMENT.sub("", line)
            stripped = line.strip()
        if cur is None and (in_section or _SECTION.match(stripped)):
            in_section = True
            continue
        try:
            if cur is not None:
                if _COMP_END.match(stripped):
                    if not cur:
                        raise ValueError(f"computation {cur_name} has no instructions")
                    comps.append(Computation(cur_name, cur, cur_entry, cur_line))
                    cur = None
                    continue
                cur.append(parse_instruction(line, lineno))
                continue
            mm = _MODULE_RE.match(line)
            if mm:
                if name is not None:
                    modules.append(_finish(name, comps, io_alias, filename, lineno))
                name, comps, io_alias = mm.group(1), [], ""
                k = line.find("input_output_alias=")
                if k >= 0:
                    j = line.index("{", k)
                    io_alias = line[j:_match_brace(line, j, "{", "}")]
                continue
            mc = _COMP_RE.match(line)
            if mc and name is not None:
                cur, cur_name, cur_entry, cur_line = [], mc.group(2), bool(mc.group(1)), lineno
                continue
            if name is None:
                raise ValueError("expected 'HloModule <name>' first: this is not HLO text")
            raise ValueError(f"unexpected line {stripped[:60]!r}")
        except (ValueError, IndexError) as exc:
            if name is not None and lineno == last_line:
                raise HloParseError(f"{filename}:{lineno}: truncated module: the last line is "
                                    f"incomplete ({exc})") from None
            raise HloParseError(f"{filename}:{lineno}: {exc}") from None
    if cur is not None:
        raise HloParseError(f"{filename}:{len(lines)}: truncated module: computation {cur_name} "
                            "is not closed")
    if name is None:
        raise HloParseError(f"{filename}:1: no HloModule found: this is not HLO text")
    modules.append(_finish(name, comps, io_alias, filename, len(lines)))
    return modules


def _finish(name: str, comps: list[Computation], io_alias: str, filename: str, lineno: int) -> HloModule:
    if not comps:
        raise HloParseError(f"{filename}:{lineno}: module {name} has no computations (truncated?)")
    _check_unique(name, comps, filename)
    mod = HloModule(name, comps, io_alias, filename)
    for c in comps:
        for ins in c.instructions:
            for op in ins.operands:
                if op not in c.by_name and op.partition("#")[0] not in c.by_name:
                    raise HloParseError(f"{filename}:{ins.line}: {ins.name} uses undefined operand {op!r}")
            for callee in ins.called:
                if callee not in mod.by_name:
                    raise HloParseError(f"{filename}:{ins.line}: {ins.name} calls unknown computation "
                                        f"{callee!r}")
    return mod


def _check_unique(name: str, comps: list[Computation], filename: str) -> None:
    """Reject what XLA's parser rejects: a computation name defined twice, two ENTRY
    computations, two ROOTs in one computation, an instruction name used twice in one."""
    seen: dict[str, Computation] = {}
    for c in comps:
        if c.name in seen:
            raise HloParseError(f"{filename}:{c.line}: computation {c.name!r} is defined twice "
                                f"(first at line {seen[c.name].line})")
        seen[c.name] = c
        roots = [ins for ins in c.instructions if ins.is_root]
        if len(roots) > 1:
            raise HloParseError(f"{filename}:{roots[1].line}: computation {c.name} has a second "
                                f"ROOT {roots[1].name!r} (the first is {roots[0].name!r})")
        names: dict[str, int] = {}
        for ins in c.instructions:
            if ins.name in names:
                raise HloParseError(f"{filename}:{ins.line}: instruction name {ins.name!r} is "
                                    f"used twice (first at line {names[ins.name]})")
            names[ins.name] = ins.line
    entries = [c for c in comps if c.is_entry]
    if len(entries) > 1:
        raise HloParseError(f"{filename}:{entries[1].line}: module {name} has a second ENTRY "
                            f"computation {entries[1].name!r}")


def parse_file(path: Path | str) -> HloModule:
    """Read and parse one HLO text file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise HloParseError(f"{path}:1: cannot read: {exc.strerror}") from None
    return parse_module(text, str(path))
