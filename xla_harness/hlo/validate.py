"""The checks of each instruction and computation the reader (:mod:`xla_harness.hlo.parser`) builds.

What XLA's parser (and the verifier every compile runs) refuses, where a scan's verdict would
otherwise rest on it: an operand or a called computation used before it is defined, ``name#k``
on a non-tuple, an opcode XLA does not know (:data:`XLA_OPCODES`), in-place and indirection ops
with the wrong number of operands, malformed ``output_to_operand_aliasing``, a fusion without
``calls=``, an async-update/-done without its operand, a transpose whose ``dimensions=`` is not a
permutation of its operand's, a constant's literal that is not its shape's or its element
type's, ``parameter(N)`` numbers taken twice or outside 0..n-1, and a declared result shape
(``-> shape``) that is not the root's. Each failure raises :class:`LineError`, which the
reader reports as an ``HloParseError`` naming the file and line.
"""

from __future__ import annotations

import re

from xla_harness.hlo.ir import Computation, Instruction, check_output_to_operand_aliasing, split_ref
from xla_harness.hlo.shapes import Shape


class LineError(ValueError):
    """A parse error that knows its own line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


# Minimum/exact operand counts of the ops the alias model reads (as XLA's parser demands).
OPERAND_COUNTS: dict[str, tuple[int, int | None]] = {
    "bitcast": (1, 1), "transpose": (1, 1), "reshape": (1, 1), "copy": (1, 1),
    "get-tuple-element": (1, 1), "dynamic-update-slice": (2, None), "set-dimension-size": (2, 2),
    "ragged-all-to-all": (6, 6), "async-done": (1, 1), "async-update": (1, None),
    "all-reduce-start": (1, None), "collective-permute-start": (1, None), "collective-permute": (1, None),
    "send": (2, 2), "recv": (1, 1), "send-done": (1, 1), "recv-done": (1, 1), "outfeed": (2, 2),
}
# Every opcode XLA's parser knows: jaxlib 0.12's HloOpcode (each name checked against its parser), and
# ones older XLA had. Async sugar ('call-start' ...) is read as async-start/-update/-done before this.
XLA_OPCODES = frozenset({
    "abs", "acos", "acosh", "add", "add-dependency", "after-all", "all-gather", "all-gather-done",
    "all-gather-start", "all-reduce", "all-reduce-done", "all-reduce-start", "all-to-all", "and", "asin", "asinh",
    "async-done", "async-start", "async-update", "atan2", "atanh", "batch-norm-grad", "batch-norm-inference",
    "batch-norm-training", "bitcast", "bitcast-convert", "broadcast", "call", "cbrt", "ceil", "cholesky", "clamp",
    "collective-broadcast", "collective-permute", "collective-permute-done", "collective-permute-start",
    "collective-reduce", "compare", "complex", "concatenate", "conditional", "constant", "convert", "convolution",
    "copy", "copy-done", "copy-start", "cosh", "cosine", "count-leading-zeros", "custom-call", "divide", "domain",
    "dot", "dynamic-reshape", "dynamic-slice", "dynamic-update-slice", "erf", "exp2", "exponential",
    "exponential-minus-one", "fft", "floor", "fusion", "gather", "get-dimension-size", "get-tuple-element", "imag",
    "infeed", "iota", "is-finite", "log", "log-plus-one", "log2", "logistic", "map", "maximum", "minimum", "mulhi",
    "multiply", "negate", "not", "opt-barrier", "or", "outfeed", "pad", "parameter", "partition-id", "popcnt",
    "power", "ragged-all-to-all", "ragged-dot", "real", "recv", "recv-done", "reduce", "reduce-precision",
    "reduce-scatter", "reduce-window", "remainder", "replica-id", "reshape", "reverse", "rng", "rng-bit-generator",
    "rng-get-and-update-state", "round-nearest-afz", "round-nearest-even", "rsqrt", "scaled-dot", "scan", "scatter",
    "select", "select-and-scatter", "send", "send-done", "set-dimension-size", "shift-left",
    "shift-right-arithmetic", "shift-right-logical", "shuffle", "sign", "sine", "sinh", "slice", "sort", "sqrt",
    "stochastic-convert", "subtract", "tan", "tanh", "topk", "transpose", "triangular-solve", "tuple", "while",
    "xor", "tuple-select", "trace"
})
# Opcodes with rules of their own (:func:`_check_rules`): XLA refuses the instruction otherwise.
_RULE_OPCODES = frozenset({"transpose", "fusion", "async-update", "async-done", "constant"})


def check_instruction(ins: Instruction, defined: dict[str, Instruction], comps: dict[str, Computation]) -> None:
    """What XLA's parser checks and the alias model relies on (raises LineError)."""
    if ins.literal and "(" in ins.literal and ins.opcode == "constant":
        _check_literal_parens(ins)
    _check_operands(ins, defined)
    for callee in ins.called:
        if callee not in comps:
            raise LineError(ins.line, f"{ins.name} calls computation {callee!r}, which is not defined before it")
    if ins.opcode in OPERAND_COUNTS or ins.opcode == "scatter":
        _check_operand_count(ins)
    if ins.opcode not in XLA_OPCODES:
        raise LineError(ins.line, f"{ins.name}: unknown opcode {ins.opcode!r}")
    if ins.opcode in _RULE_OPCODES:
        _check_rules(ins, defined)
    if "output_to_operand_aliasing" in ins.attr_text:
        try:
            pairs = check_output_to_operand_aliasing(ins.attrs.get("output_to_operand_aliasing", ""))
        except ValueError as exc:
            raise LineError(ins.line, f"{ins.name}: {exc}") from None
        for _, op_num, _ in pairs:
            if op_num >= len(ins.operands) and ins.opcode not in ("async-start", "async-update"):
                raise LineError(ins.line, f"{ins.name}: output_to_operand_aliasing names operand {op_num}, "
                                          f"it has {len(ins.operands)}")


def check_line_instruction(ins: Instruction, defined: dict[str, Instruction], comps: dict[str, Computation]) -> None:
    """``check_instruction`` of an instruction with no '(' in its literal and no
    output_to_operand_aliasing: the common case inline, the full check where one fails (it says which)."""
    for op in ins.operands:
        if op not in defined:  # undefined, or 'name#k': the full check says which
            _check_operands(ins, defined)
            break
    for callee in ins.called:
        if callee not in comps:
            check_instruction(ins, defined, comps)
    opcode = ins.opcode
    if opcode not in XLA_OPCODES:
        raise LineError(ins.line, f"{ins.name}: unknown opcode {opcode!r}")
    if opcode in _RULE_OPCODES:
        _check_rules(ins, defined)
    if opcode == "scatter":
        n = len(ins.operands)
        if n < 3 or n % 2 == 0:
            _check_operand_count(ins)
    else:
        lo_hi = OPERAND_COUNTS.get(opcode)
        if lo_hi is not None and not ins.async_wrapped:
            n = len(ins.operands)
            if n < lo_hi[0] or (lo_hi[1] is not None and n > lo_hi[1]):
                _check_operand_count(ins)


def _compatible(a: Shape, b: Shape) -> bool:
    """Same element types, dims and tuple structure, layouts aside (XLA's ``ShapeUtil::Compatible``)."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if x.tuple_shapes is not None or y.tuple_shapes is not None:
            if x.tuple_shapes is None or y.tuple_shapes is None or len(x.tuple_shapes) != len(y.tuple_shapes):
                return False
            pending.extend(zip(x.tuple_shapes, y.tuple_shapes, strict=True))
        elif x.element_type != y.element_type or x.dims != y.dims:
            return False
    return True


def check_result_shape(comp: Computation, declared: Shape) -> None:
    """The '-> shape' of a computation's signature is its root's shape (as XLA's parser demands)."""
    root = comp.root
    if _compatible(declared, root.shape):
        return
    which = (f"root {root.name!r} (line {root.line})" if root.is_root
             else f"last instruction {root.name!r} (line {root.line}; there is no ROOT line, so it is the root)")
    raise LineError(comp.line, f"computation {comp.name} declares result shape {declared}, but its {which} "
                               f"has shape {root.shape}")


_NUMBERS = [str(k) for k in range(256)]
_NUMBER_SETS = [frozenset(_NUMBERS[:n]) for n in range(len(_NUMBERS) + 1)]


def check_parameter_numbers(comp: str, instructions: list[Instruction]) -> None:
    """parameter(N): N an integer, each once, all of 0..n-1 for n parameters (as XLA demands;
    its parser aborts the process on a number out of range)."""
    params = [ins for ins in instructions if ins.opcode == "parameter"]
    if not params:
        return
    if len(params) <= len(_NUMBERS) and {ins.literal for ins in params} == _NUMBER_SETS[len(params)]:
        return  # '0' .. 'n-1', each once (the common case)
    seen: dict[int, Instruction] = {}
    for ins in params:
        text = ins.literal.strip()
        if not text.lstrip("-").isdigit():
            raise LineError(ins.line, f"{ins.name}: parameter number {text!r} is not an integer")
        number = int(text)
        if number < 0:
            raise LineError(ins.line, f"{ins.name}: parameter number {number} is negative")
        if number in seen:
            raise LineError(ins.line, f"{ins.name}: parameter number {number} is used twice in computation {comp} "
                                      f"(first by {seen[number].name!r} at line {seen[number].line})")
        seen[number] = ins
    for ins in params:
        if ins.parameter_number >= len(params):
            raise LineError(ins.line, f"{ins.name}: parameter number {ins.parameter_number} is out of range: "
                                      f"computation {comp} has {len(params)} parameter(s), "
                                      f"numbered 0..{len(params) - 1}")


_NAN_PAYLOAD = re.compile(r"nan\(0x[0-9a-fA-F]+\)")


def _check_literal_parens(ins: Instruction) -> None:
    """XLA takes '(' in a literal only for complex numbers, tuples and NaN payloads."""
    if ins.shape.is_tuple or ins.shape.element_type in ("c64", "c128"):
        return
    if "(" in _NAN_PAYLOAD.sub("", ins.literal):
        raise LineError(ins.line, f"{ins.name}: '(' in the literal of a {ins.shape.element_type} constant "
                                  "(parens are only for complex numbers and tuples)")


def _check_operands(ins: Instruction, defined: dict[str, Instruction]) -> None:
    for op in ins.operands:
        if "#" not in op and op in defined:
            continue  # the common case
        base, index = split_ref(op)
        src = defined.get(base)
        if src is None:
            why = " (itself: a cycle)" if base == ins.name else " (operands are defined before use)"
            raise LineError(ins.line, f"{ins.name} uses undefined operand {base!r}{why}")
        if index:
            try:
                src.shape.subshape(index)
            except IndexError:
                raise LineError(ins.line, f"{ins.name}: operand {op!r} selects a tuple element {src.name} "
                                          "does not have") from None


def _check_operand_count(ins: Instruction) -> None:
    n = len(ins.operands)
    if ins.opcode == "scatter" and (n < 3 or n % 2 == 0):
        raise LineError(ins.line, f"{ins.name}: scatter takes 2N+1 operands (N inputs, indices, N updates), got {n}")
    lo_hi = OPERAND_COUNTS.get(ins.opcode)
    if lo_hi is not None and (not ins.async_wrapped or ins.opcode in ("async-update", "async-done")):
        lo, hi = lo_hi
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"at least {lo}"
            raise LineError(ins.line, f"{ins.name}: {ins.opcode} takes {want} operand(s), got {n}")


def _check_rules(ins: Instruction, defined: dict[str, Instruction]) -> None:
    """What XLA refuses of these opcodes (its parser, or the verifier every compile runs), where a
    scan's verdict would otherwise rest on it."""
    opcode = ins.opcode
    if opcode == "transpose":
        _check_transpose(ins, defined)
    elif opcode == "fusion":
        if not ins.called:
            raise LineError(ins.line, f"{ins.name}: a fusion names the computation it fuses with calls=")
    elif opcode == "constant":
        _check_constant(ins)
    elif not ins.operands:  # async-update/-done, sugar included ('call-done()')
        shown = f"{ins.async_wrapped}-{opcode.rpartition('-')[2]}" if ins.async_wrapped else opcode
        raise LineError(ins.line, f"{ins.name}: {shown} takes the async-start (or -update) it continues as its operand")


def _check_transpose(ins: Instruction, defined: dict[str, Instruction]) -> None:
    """``dimensions=`` a permutation of the operand's dimensions, the result its operand permuted."""
    if "dimensions" not in ins.attr_text:
        raise LineError(ins.line, f"{ins.name}: transpose needs dimensions=")
    try:
        perm = ins.int_list("dimensions")
    except ValueError:
        raise LineError(ins.line, f"{ins.name}: transpose dimensions= is not a list of integers") from None
    base, index = split_ref(ins.operands[0]) if ins.operands else ("", ())
    src = defined.get(base)
    if src is None:
        return
    try:
        operand = src.shape.subshape(index) if index else src.shape
    except IndexError:
        return  # _check_operands says so
    if operand.tuple_shapes is not None:
        raise LineError(ins.line, f"{ins.name}: transpose of a tuple")
    rank = len(operand.dims)
    if sorted(perm) != list(range(rank)):
        raise LineError(ins.line, f"{ins.name}: transpose dimensions={{{','.join(map(str, perm))}}} is not a "
                                  f"permutation of the {rank} dimensions of its operand {operand}")
    want = tuple(operand.dims[d] for d in perm)
    if ins.shape.tuple_shapes is None and ins.shape.dims != want:
        raise LineError(ins.line, f"{ins.name}: transpose of {operand} by {{{','.join(map(str, perm))}}} has "
                                  f"dimensions {list(want)}, not {list(ins.shape.dims)}")


# The literal's tokens: braces, commas, a complex '(re, im)', or a value.
_LITERAL_TOKEN = re.compile(r"-?nan\(0x[0-9a-fA-F]+\)|[{},]|\([^()]*\)|[^\s{},()]+")
_FLOAT_VALUE = re.compile(r"-?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|inf|nan(?:\(0x([0-9a-fA-F]+)\))?)")
_INT_VALUE = re.compile(r"-?\d+")
# Element types: (values below ... rounds to infinity, the widest NaN payload) / (lowest, highest).
_FLOAT_LIMITS = {"f16": (65520.0, 0x3FF), "bf16": ((2 - 2**-8) * 2.0**127, 0x7F),
                 "f32": ((2 - 2**-24) * 2.0**127, 0x7FFFFF), "f64": (float("inf"), 0xFFFFFFFFFFFFF)}
_INT_BITS = {"s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
             "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def _check_constant(ins: Instruction) -> None:
    """A constant's literal as XLA's parser reads it: nested as deep as the shape's rank with each
    dimension's count of elements (or one value for all, or ``{...}`` elided), values of the element
    type and in its range (a float that rounds to infinity, a NaN payload wider than the mantissa, an
    integer outside its bits are refused)."""
    shape = ins.shape
    etype = shape.element_type
    text = ins.literal.strip()
    if shape.tuple_shapes is not None or etype in ("token", "opaque") or text.startswith("{...}") or not text:
        return
    tokens = _LITERAL_TOKEN.findall(text)
    if tokens and tokens[0] == "{" and not shape.dims:
        raise LineError(ins.line, f"{ins.name}: the literal of a scalar constant is one value, not a list")
    _check_nesting(ins, tokens)


def _check_nesting(ins: Instruction, tokens: list[str]) -> None:
    """The literal's lists nest as the shape's dimensions, each with its count; every value checked."""
    shape = ins.shape
    etype = shape.element_type
    dims = shape.dims
    depth = 0
    counts: list[int] = []  # elements (or lists) seen at each open level
    for tok in tokens:
        if tok == "{":
            if counts:
                counts[-1] += 1
            depth += 1
            counts.append(0)
            if depth > len(dims):
                raise LineError(ins.line, f"{ins.name}: the literal nests deeper than the constant's rank {len(dims)}")
        elif tok == "}":
            if not counts:
                raise LineError(ins.line, f"{ins.name}: unbalanced '}}' in the literal")
            seen = counts.pop()
            want = dims[depth - 1]
            if want >= 0 and seen != want:
                raise LineError(ins.line, f"{ins.name}: the literal has {seen} element(s) where dimension "
                                          f"{depth - 1} of {shape} has {want}")
            depth -= 1
        elif tok != ",":
            if counts:
                counts[-1] += 1
                if depth != len(dims):
                    raise LineError(ins.line, f"{ins.name}: the literal nests {depth} deep, the constant's rank is "
                                              f"{len(dims)}")
            _check_value(ins, etype, tok)


def _check_value(ins: Instruction, etype: str, tok: str) -> None:
    if etype in _INT_BITS:
        if not _INT_VALUE.fullmatch(tok):
            raise LineError(ins.line, f"{ins.name}: {tok!r} is not an integer ({etype} constant)")
        bits = _INT_BITS[etype]
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if etype[0] == "s" else (0, 2**bits - 1)
        if not lo <= int(tok) <= hi:
            raise LineError(ins.line, f"{ins.name}: {tok} is out of range for {etype} [{lo}, {hi}]")
        return
    if etype == "pred":
        if tok not in ("true", "false") and not _INT_VALUE.fullmatch(tok):
            raise LineError(ins.line, f"{ins.name}: {tok!r} is not a pred value (true, false or an integer)")
        return
    if etype in ("c64", "c128"):
        return
    m = _FLOAT_VALUE.fullmatch(tok)
    if m is None:
        raise LineError(ins.line, f"{ins.name}: {tok!r} is not a number ({etype} constant)")
    limits = _FLOAT_LIMITS.get(etype)
    if limits is None:
        return
    limit, payload = limits
    if m.group(1) is not None:
        if int(m.group(1), 16) > payload:
            raise LineError(ins.line, f"{ins.name}: NaN payload 0x{m.group(1)} is wider than {etype}'s mantissa "
                                      f"(at most 0x{payload:x})")
    elif "inf" not in tok and "nan" not in tok and abs(float(tok)) >= limit:
        raise LineError(ins.line, f"{ins.name}: {tok} is out of range for {etype} (it rounds to infinity)")
