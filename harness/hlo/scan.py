"""Scan compiled HLO for fusions whose in-place operand reaches a parameter through a
transpose or reshape, and classify each in-place fusion output:

``aliased``                 every policy pairs it with its parameter;
``layout-preserving-miss``  stock XLA misses the pair, the layout-aware policy finds it
                            (the transpose/reshape on the way is a bitcast under its layouts);
``hazard``                  only the as-reported policy pairs it: the way back to the parameter
                            goes through a transpose or reshape that moves data, so treating
                            it as in-place would let the emitter overwrite what it still reads.

For a hazard the report also names, in the calling computation, the value feeding that
parameter and its other users (the tied-embedding pattern: the same buffer feeds a dot).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from harness.hlo import alias
from harness.hlo.parser import Computation, HloModule, Instruction

CLASSES = ("aliased", "layout-preserving-miss", "hazard")
DENSE_OPCODES = ("dot", "convolution")


@dataclass(frozen=True)
class Finding:
    fusion: str
    computation: str
    root_opcode: str
    output_index: list[int]
    parameter: int
    parameter_index: list[int]
    path: list[str]
    stock: bool
    proposed: bool
    layout_aware: bool
    cls: str
    # Context for hazards (not part of the JSON schema): the caller's value feeding the
    # parameter and that value's other users.
    source: str = ""
    other_users: list[str] = field(default_factory=list)
    feeds_dense: bool = False

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("source", "other_users", "feeds_dense"):
            d.pop(k)
        d["class"] = d.pop("cls")
        return d


def _contains_dense(module: HloModule, ins: Instruction, depth: int = 0) -> bool:
    if ins.opcode in DENSE_OPCODES:
        return True
    if ins.opcode == "custom-call" and ("gemm" in ins.attrs.get("custom_call_target", "").lower()
                                        or "matmul" in ins.attrs.get("custom_call_target", "").lower()):
        return True
    if ins.opcode == "fusion" and depth < 4:
        comp = module.by_name.get(ins.called[0]) if ins.called else None
        return comp is not None and any(_contains_dense(module, i, depth + 1) for i in comp.instructions)
    return False


def _context(module: HloModule, caller: Computation, fusion: Instruction, parameter: int
             ) -> tuple[str, list[str], bool]:
    if parameter >= len(fusion.operands):
        return "", [], False
    source = fusion.operands[parameter]
    users = [u for u in caller.users(source.partition("#")[0]) if u.name != fusion.name]
    dense = any(_contains_dense(module, u) for u in users)
    return source, [f"{u.name} ({u.opcode})" for u in users], dense


def scan_fusion(module: HloModule, caller: Computation, fusion: Instruction) -> list[Finding]:
    by_policy = {p: {pair.output_index: pair for pair in alias.fusion_in_place_pairs(module, fusion, p)}
                 for p in alias.POLICIES}
    findings = []
    for index in sorted(set().union(*(set(v) for v in by_policy.values()))):
        stock = index in by_policy["stock"]
        proposed = index in by_policy["proposed"]
        la = index in by_policy["layout-aware"]
        if stock and proposed and la:
            cls = "aliased"
        elif la and proposed:
            cls = "layout-preserving-miss"
        elif proposed:
            cls = "hazard"
        else:  # not reachable for nested policies; kept so nothing is silently dropped
            cls = "aliased" if stock else "hazard"
        pair = by_policy["proposed"].get(index) or by_policy["layout-aware"].get(index) \
            or by_policy["stock"][index]
        root = alias.output_source(module, fusion, index, "proposed")
        source, users, dense = _context(module, caller, fusion, pair.operand_index) if cls == "hazard" \
            else ("", [], False)
        findings.append(Finding(fusion.name, caller.name, root.opcode, list(index), pair.operand_index,
                                list(pair.operand_shape_index), list(pair.path), stock, proposed, la, cls,
                                source, users, dense))
    return findings


def scan_module(module: HloModule) -> list[Finding]:
    """Every in-place fusion output of the module, classified."""
    out: list[Finding] = []
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode == "fusion" and ins.called:
                out.extend(scan_fusion(module, comp, ins))
    return out


def module_json(module: HloModule, findings: list[Finding]) -> dict:
    return {"module": module.name, "findings": [f.to_json() for f in findings]}


def format_findings(module: HloModule, findings: list[Finding], show_aliased: bool = False) -> str:
    """Human table of one module's findings (aliased ones summarised unless asked for)."""
    counts = {c: sum(f.cls == c for f in findings) for c in CLASSES}
    lines = [f"{module.name} ({module.filename}): {module.instruction_count()} instructions, "
             f"{counts['hazard']} hazard, {counts['layout-preserving-miss']} layout-preserving-miss, "
             f"{counts['aliased']} aliased"]
    shown = [f for f in findings if show_aliased or f.cls != "aliased"]
    if shown:
        rows = [("class", "fusion", "computation", "root", "out", "param", "path", "stock/proposed/layout")]
        for f in shown:
            rows.append((f.cls, f.fusion, f.computation, f.root_opcode, str(tuple(f.output_index)),
                         f"{f.parameter}{tuple(f.parameter_index) if f.parameter_index else ''}",
                         " <- ".join(f.path) or "(parameter)",
                         "/".join("y" if b else "n" for b in (f.stock, f.proposed, f.layout_aware))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        for f in shown:
            if f.cls == "hazard" and f.source:
                users = ", ".join(f.other_users) or "none"
                lines.append(f"  hazard {f.fusion}: parameter {f.parameter} is {f.source} in "
                             f"{f.computation}; its other users: {users}"
                             + ("  <- also feeds a dot (tied-embedding pattern)" if f.feeds_dense else ""))
    return "\n".join(lines)
