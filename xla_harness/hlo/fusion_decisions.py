"""The scan's second finding class, ``scatter-fused-with-data-moving-producer``: a fusion whose
scatter takes its in-place operand from a data-moving op inside the fusion (a transpose or
reshape that is not a bitcast under its layouts, a reverse, a layout-changing copy) that reads
a fusion parameter: the fusion XLA's patched ``ShouldFuseInPlaceOp`` no longer creates (the
shape of jax-ml/jax#35409). :mod:`xla_harness.hlo.scan` asks it of each outermost fusion.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from xla_harness.hlo.alias import AliasAnalysis, opcodes
from xla_harness.hlo.bitcast import BitcastDecisions
from xla_harness.hlo.ir import Computation, HloModule, Instruction

FUSION_DECISION_CLASS = "scatter-fused-with-data-moving-producer"
_DATA_MOVING_UNARY = ("transpose", "reshape", "copy", "reverse")


@dataclass(frozen=True)
class FusionDecisionFinding:
    """A scatter fused with the data-moving producer of its in-place operand."""

    fusion: str
    computation: str
    scatter: str
    operand: int  # the scatter's in-place operand number
    producer: str  # the first data-moving op on the way, 'name (opcode)'
    parameter: int
    path: list[str]  # opcodes from the scatter operand back to the parameter
    cls: str = FUSION_DECISION_CLASS

    def to_json(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("cls")
        return d


def _moves_data(ins: Instruction, comp: Computation, bitcasts: BitcastDecisions) -> bool:
    """Physically, under the layouts (whatever a backend's alias rule calls a no-op)."""
    if ins.opcode in ("transpose", "reshape", "copy"):  # a copy moves data when it changes the layout,
        return not bitcasts.is_bitcast_equivalent(ins, comp)  # the tiles or the memory space
    return ins.opcode == "reverse"


def _scatters(module: HloModule, comp: Computation, frames: tuple = (), depth: int = 0):
    """Every scatter in ``comp`` and in the fusions nested in it (libtpu puts each scatter at the root
    of a kCustom fusion inside a kLoop fusion), with the frames (outer computation, nested fusion
    instruction) that lead from ``comp`` to the scatter's computation."""
    if depth > 16:
        return
    for ins in comp.instructions:
        if ins.opcode == "scatter":
            yield ins, comp, frames
        elif ins.opcode == "fusion" and ins.called and ins.called[0] in module.by_name:
            yield from _scatters(module, module.computation(ins.called[0]), (*frames, (comp, ins)), depth + 1)


def _trace_to_parameter(analysis: AliasAnalysis, comp: Computation, ref: str, frames: tuple
                        ) -> tuple[int | None, list[str], Instruction | None]:
    """Follow operand ``ref`` of ``comp`` back through bitcasts, data-moving unary ops and nested
    fusions (into a nested fusion's root; out of a nested computation's parameter to the operand of
    the fusion that calls it, ``frames`` saying which) to a parameter of the outermost computation:
    (its number or None, the opcodes passed, the first data-moving op)."""
    module = analysis.module
    path: list[str] = []
    producer = None
    stack = list(frames)
    ins, index = comp.operand(ref)
    for _ in range(100_000):
        if ins.opcode == "parameter" and not index:
            if not stack:
                return ins.parameter_number, path, producer
            comp, nested = stack.pop()
            if ins.parameter_number >= len(nested.operands):
                return None, path, producer
            ins, index = comp.operand(nested.operands[ins.parameter_number])
        elif not index and ins.opcode in ("bitcast", *_DATA_MOVING_UNARY) and ins.operands:
            if producer is None and _moves_data(ins, comp, analysis.bitcasts):
                producer = ins
            path.append(ins.opcode)
            ins, index = comp.operand(ins.operands[0])
        elif not index and ins.opcode == "fusion" and ins.called and ins.called[0] in module.by_name \
                and not ins.shape.is_tuple and len(stack) < 32:
            stack.append((comp, ins))
            comp = module.computation(ins.called[0])
            path.append("fusion")
            ins, index = comp.root, ()
        else:
            return None, path, producer
    return None, path, producer


def fusion_decision_findings(analysis: AliasAnalysis, caller: Computation, fusion: Instruction,
                             backend: str = "unknown", memo: dict | None = None,
                             structure: tuple | None = None, ops: frozenset[str] | None = None
                             ) -> list[FusionDecisionFinding]:
    """Scatters in the fusion (nested fusions included) whose in-place operand is a data-moving op
    reading one of the fusion's parameters (inside a nested fusion too; ``analysis`` is the module's).
    ``memo`` with the fusion's :func:`xla_harness.hlo.scan._structure` reuses the answer for a fusion
    of the same structure (by positions)."""
    if "scatter" not in (ops if ops is not None else opcodes(analysis, fusion.called[0])):
        return []
    module = analysis.module
    fused = module.computation(fusion.called[0])
    key = ("decisions", structure)
    found = memo.get(key) if memo is not None and structure is not None else None
    if found is None:
        found = []
        for scatter, comp, frames in _scatters(module, fused):
            for operand in range((len(scatter.operands) - 1) // 2):
                parameter, path, producer = _trace_to_parameter(analysis, comp, scatter.operands[operand], frames)
                if producer is not None and parameter is not None:
                    found.append((scatter, comp, operand, producer, parameter, path))
        if memo is not None and structure is not None:  # by positions: a structure has no nested fusion
            where = {id(ins): k for k, ins in enumerate(fused.instructions)}
            memo[key] = [(where[id(s)], operand, where[id(p)], parameter, path)
                         for s, _, operand, p, parameter, path in found]
    else:
        found = [(fused.instructions[s], fused, operand, fused.instructions[p], parameter, path)
                 for s, operand, p, parameter, path in found]
    return [FusionDecisionFinding(fusion.name, caller.name, scatter.name, operand,
                                  f"{producer.name} ({producer.opcode})", parameter, list(path))
            for scatter, _, operand, producer, parameter, path in found]
