"""What the compiler itself says it aliases: libtpu writes, in every instruction's
``backend_config``, ``"aliasing_operands":{"lists":[{"indices":["0","4"]}]}``: each list is a group
of indices over the instruction's operands (0..n-1) followed by its outputs (n.. for output 0, 1,
... of a tuple-shaped instruction), so ``["0","4"]`` on a 4-operand fusion is "operand 0 shares its
buffer with the output". ``{"lists":[]}`` says nothing is aliased. This is the ground truth the
structural walk of :mod:`xla_harness.hlo.scan` can be checked against on TPU modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from xla_harness.hlo.alias import opcodes
from xla_harness.hlo.ir import HloModule, Instruction

KEY = "aliasing_operands"


@dataclass(frozen=True)
class CompilerAlias:
    """One (operand, output) pair the compiler aliased in ``instruction`` of ``computation``."""

    computation: str
    instruction: str
    opcode: str
    operand: int
    output_index: tuple[int, ...]


def _find_key(value, key: str):
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for v in value.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(value, list):
        for v in value:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def instruction_pairs(ins: Instruction) -> list[tuple[int, tuple[int, ...]]] | None:
    """``[(operand, output index), ...]`` the compiler aliased in ``ins``; None when its backend_config
    says nothing about aliasing (not a libtpu module, or no such key), [] when it says "none"."""
    if KEY not in ins.attr_text:
        return None
    raw = ins.attrs.get("backend_config", "")
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    field = _find_key(config, KEY)
    groups = field.get("lists", []) if isinstance(field, dict) else []
    n = len(ins.operands)
    pairs: list[tuple[int, tuple[int, ...]]] = []
    for group in groups:
        try:
            idx = [int(i) for i in group.get("indices", [])]
        except (TypeError, ValueError, AttributeError):
            continue
        operands = [i for i in idx if 0 <= i < n]
        outputs = [i - n for i in idx if i >= n]
        for out in outputs:
            where = (out,) if ins.shape.is_tuple else ()
            pairs.extend((op, where) for op in operands)
    return pairs


def module_pairs(module: HloModule) -> list[CompilerAlias]:
    """Every aliased (operand, output) pair the compiler wrote into the module's backend configs."""
    out = []
    for comp in module.computations:
        for ins in comp.instructions:
            for operand, index in instruction_pairs(ins) or ():
                out.append(CompilerAlias(comp.name, ins.name, ins.opcode, operand, index))
    return out


def summary(module: HloModule) -> dict:
    """Counts for a compile record: instructions carrying the compiler's aliasing field, fusions it
    aliased, and of those the ones holding a scatter (nested fusions included)."""
    carrying = aliased = scatter = 0
    for comp in module.computations:
        for ins in comp.instructions:
            pairs = instruction_pairs(ins)
            if pairs is None:
                continue
            carrying += 1
            if pairs and ins.opcode == "fusion":
                aliased += 1
                if any("scatter" in opcodes(module, c) for c in ins.called):
                    scatter += 1
    return {"instructions_with_field": carrying, "aliased_fusions": aliased, "aliased_scatter_fusions": scatter}
