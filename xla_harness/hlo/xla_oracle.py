"""Differential check of the HLO reader against XLA's own parser (through jaxlib).

``compare(text)`` parses the text with both and returns a ``Verdict``: does each accept it,
and, when both do, the first difference in computations, instruction order, names, opcodes,
shapes (with layouts), operands and roots. XLA's side is read from the parsed module's
objects (``computations()``, ``instructions()``, ``operands()``), the roots and the entry
from its reprint. Two things XLA adds while parsing are mapped back: a ``name#k`` operand
becomes a get-tuple-element instruction in XLA (read back as ``name#k``), and async sugar
(``call-start``) gets a wrapped computation that the text does not have. XLA makes names
unique in the module (a second ``p0`` becomes ``p0.1``): names are matched by stem in order.
The computations each instruction calls are compared too (as sets). Not compared: the
element size ``E(n)`` of a layout (XLA's printer omits the default one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from xla_harness.hlo.ir import Computation, HloModule
from xla_harness.hlo.parser import HloParseError, parse_module
from xla_harness.hlo.shapes import Shape, parse_shape

_COMMENT = re.compile(r"/\*.*?\*/")
_UNIQUE_SUFFIX = re.compile(r"\.\d+$")
_ELEMENT_SIZE = re.compile(r"E\(\d+\)")

_KEBAB = re.compile(r"(?<!^)(?=[A-Z])")
_OPCODE_EXCEPTIONS = {"kClz": "count-leading-zeros", "kCos": "cosine", "kExp": "exponential",
                      "kExpm1": "exponential-minus-one", "kLog1p": "log-plus-one",
                      "kOptimizationBarrier": "opt-barrier", "kPopulationCount": "popcnt", "kSin": "sine",
                      "kTopK": "topk"}
_COMP_LINE = re.compile(r"^(ENTRY )?%?(\S+) .*\{\s*$|^(ENTRY )?%?(\S+) \{\s*$")
_ROOT_LINE = re.compile(r"^\s*ROOT %?([^\s=]+) =")
_INDEX_ATTR = re.compile(r"index=(\d+)")
_XLA_CALL = re.compile(r"(?<![\w.\-])(calls|to_apply|body|condition|true_computation|false_computation|"
                       r"branch_computations|called_computations|select|scatter)=(\{[^}]*\}|%?[^\s,{}]+)")


def opcode_text(enum_name: str) -> str:
    """'kGetTupleElement' -> 'get-tuple-element' (XLA's opcode strings)."""
    return _OPCODE_EXCEPTIONS.get(enum_name) or _KEBAB.sub("-", enum_name[1:]).lower()


def _norm_shape(shape: Shape) -> tuple:
    """Leaves as (type, dims, layout, tiles, buffer), XLA's default layout where none is printed."""
    return tuple((s.element_type, s.dims, s.layout_or_default() if s.dims or s.minor_to_major else (),
                  _ELEMENT_SIZE.sub("", s.layout_extra), s.is_buffer) for _, s in shape.leaves()) + (
        ("tuple-arity", len(shape.tuple_shapes)) if shape.tuple_shapes is not None else ())


@dataclass
class Verdict:
    xla_accepts: bool
    ours_accepts: bool
    mismatch: str = ""  # first structural difference when both accept
    xla_error: str = ""
    ours_error: str = ""
    reprint: str = ""  # XLA's to_string() when it accepts

    @property
    def category(self) -> str:
        if self.xla_accepts and not self.ours_accepts:
            return "ours-rejects"
        if self.ours_accepts and not self.xla_accepts:
            return "ours-accepts-xla-rejects"
        if self.xla_accepts and self.mismatch:
            return "mismatch"
        return "agree"


# XLA's side of one computation: its root's name and a row per instruction,
# (name, opcode, shape text, operand names, XLA's instruction object).
XlaRow = tuple[str, str, str, list[str], Any]
XlaComputation = tuple[str, list[XlaRow]]


def xla_structure(xla_module, reprint: str) -> tuple[dict[str, XlaComputation], str]:
    """{computation: (root, [(name, opcode, shape, operands, ins)])} and the entry name, from XLA's objects."""
    roots: dict[str, str] = {}
    entry = ""
    current = None
    for line in reprint.splitlines():
        m = _COMP_LINE.match(line)
        if m and not line.startswith(" "):
            current = m.group(2) or m.group(4)
            if m.group(1) or m.group(3):
                entry = current
            continue
        r = _ROOT_LINE.match(line)
        if r and current is not None:
            roots[current] = r.group(1)
    out: dict[str, XlaComputation] = {}
    for comp in xla_module.computations():
        rows: list[XlaRow] = []
        for ins in comp.instructions():
            rows.append((ins.name, opcode_text(ins.opcode.name), _COMMENT.sub("", str(ins.shape)),
                         [o.name for o in ins.operands()], ins))
        out[comp.name] = (roots.get(comp.name, rows[-1][0] if rows else ""), rows)
    return out, entry


def compare_structures(ours: HloModule, xla_module, reprint: str) -> str:
    """The first difference between our reading and XLA's, '' when none."""
    xla, xla_entry = xla_structure(xla_module, reprint)
    has_sugar = any(i.async_wrapped for c in ours.computations for i in c.instructions)
    xla_names = list(xla)
    matched: dict[str, str] = {}  # ours -> XLA (XLA makes names unique in the module)
    k = 0
    for comp in ours.computations:
        j = k
        while j < len(xla_names) and not _same_stem(comp.name, xla_names[j]):
            j += 1
        if j == len(xla_names):
            return f"ours has computation {comp.name} that XLA does not"
        if j > k and not has_sugar:
            return f"XLA has computations {xla_names[k:j][:3]} that ours does not"
        matched[comp.name] = xla_names[j]
        k = j + 1
    if k < len(xla_names) and not has_sugar:
        return f"XLA has computations {xla_names[k:][:3]} that ours does not"
    if xla_entry and matched.get(ours.entry.name) != xla_entry:
        return f"entry: ours {ours.entry.name}, XLA {xla_entry}"
    for comp in ours.computations:
        xla_root, xla_rows = xla[matched[comp.name]]
        diff = _compare_computation(comp, xla_root, xla_rows, matched)
        if diff:
            return f"computation {comp.name}: {diff}"
    return ""


def _compare_computation(comp: Computation, xla_root: str, xla_rows: list[XlaRow], matched: dict[str, str]) -> str:
    synthesized: set[str] = set()  # XLA's names for the get-tuple-elements it makes of 'p#1#0': p_1, p_1_0
    for i in comp.instructions:
        for o in i.operands:
            parts = o.split("#")
            synthesized.update("_".join(parts[:n]) for n in range(2, len(parts) + 1))
    alias: dict[str, str] = {}  # XLA's synthesized get-tuple-element -> 'base#k'
    rows: list[XlaRow] = []
    extra = len(xla_rows) - len(comp.instructions)
    for name, opcode, shape, operands, ins in xla_rows:
        operands = [alias.get(o, o) for o in operands]
        if (extra > 0 and opcode == "get-tuple-element"
                and (name in synthesized or _UNIQUE_SUFFIX.sub("", name) in synthesized)):
            extra -= 1
            m = _INDEX_ATTR.search(ins.to_string())
            alias[name] = f"{operands[0]}#{m.group(1) if m else '?'}"
            continue
        rows.append((name, opcode, shape, operands, ins))
    if len(rows) != len(comp.instructions):
        return f"{len(comp.instructions)} instructions, XLA {len(rows)}"
    renamed = {}  # XLA makes names unique in the module: 'p0' in a second computation is 'p0.1'
    for ins, row in zip(comp.instructions, rows, strict=True):
        if ins.name != row[0] and _same_stem(ins.name, row[0]):
            renamed[row[0]] = ins.name
    def ref(o: str) -> str:
        base, sep, k = o.partition("#")
        return renamed.get(base, base) + sep + k

    rows = [(renamed.get(n, n), op, sh, [ref(o) for o in ops], x) for n, op, sh, ops, x in rows]
    xla_root = ref(alias.get(xla_root, xla_root))
    for ins, row in zip(comp.instructions, rows, strict=True):
        diff = _compare_instruction(ins, *row[:4]) or _compare_called(ins, row[4], matched)
        if diff:
            return diff
    if comp.root.name != xla_root:
        return f"root: ours {comp.root.name}, XLA {xla_root}"
    return ""


def _compare_instruction(ins, name: str, opcode: str, shape: str, operands: list[str]) -> str:
    """The first difference in one instruction, '' when none."""
    if ins.name != name:
        return f"instruction order: ours {ins.name}, XLA {name}"
    if ins.opcode != opcode:
        return f"{name}: opcode ours {ins.opcode}, XLA {opcode}"
    if _norm_shape(ins.shape) != _norm_shape(parse_shape(shape)[0]):
        return f"{name}: shape ours {ins.shape}, XLA {shape}"
    ours_ops = list(ins.operands)
    if ins.async_wrapped and ins.opcode != "async-start":
        ours_ops = ours_ops[:len(operands)]
    if ours_ops != operands:
        return f"{name}: operands ours {ours_ops}, XLA {operands}"
    return ""


def _compare_called(ins, xla_ins, matched: dict[str, str]) -> str:
    """The computations an instruction calls (calls=, to_apply=, body= ...), as sets."""
    if ins.async_wrapped or ins.opcode.startswith("async-"):
        return ""  # XLA wraps the sugar's callee in a computation the text does not have
    xla_called = sorted(n.strip().lstrip("%") for m in _XLA_CALL.finditer(xla_ins.to_string())
                        for n in m.group(2).strip("{}").split(",") if n.strip())
    ours = sorted(matched.get(c, c) for c in ins.called)
    if ours != xla_called:
        return f"{ins.name}: calls ours {ours}, XLA {xla_called}"
    return ""


def _same_stem(ours: str, xla: str) -> bool:
    return _UNIQUE_SUFFIX.sub("", ours) == _UNIQUE_SUFFIX.sub("", xla) or _UNIQUE_SUFFIX.sub("", xla) == ours


def compare(text: str, filename: str = "<string>") -> Verdict:
    """Parse ``text`` with XLA (jaxlib) and with ours; say where they disagree."""
    from xla_harness import jaxcompat
    from xla_harness.errors import HarnessError

    if not jaxcompat.xla_hlo_reads_structure():
        import jaxlib

        raise HarnessError(f"jaxlib {jaxlib.__version__} does not expose the instructions and shapes of "
                           "XLA's parsed HLO module (jaxlib >= 0.12 does): the XLA comparison needs a newer jaxlib")
    xla_hlo = jaxcompat.xla_hlo()
    try:
        xla_module = xla_hlo.hlo_module_from_text(text)
        reprint = xla_module.to_string()
        xla_ok, xla_err = True, ""
    except Exception as exc:  # noqa: BLE001 - any rejection by XLA counts
        lines = str(exc).splitlines()  # the first line is generic; the second says where and why
        xla_module, reprint, xla_ok, xla_err = None, "", False, " ".join(lines[1:3] or lines)[:200]
    try:
        ours = parse_module(text, filename)
        ours_ok, ours_err = True, ""
    except HloParseError as exc:
        ours, ours_ok, ours_err = None, False, str(exc)
    verdict = Verdict(xla_ok, ours_ok, "", xla_err, ours_err, reprint)
    if ours is not None and xla_ok:
        verdict.mismatch = compare_structures(ours, xla_module, reprint)
    return verdict
