"""Which values are one buffer: the grouping rules (what XLA's alias analysis does), each a function
of the plan and the dataflow returning the groups of value ids it makes one buffer, each named in
findings and tested alone (tests/hlo/memplan/test_rules.py). :func:`group` applies them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xla_harness.errors import HarnessError
from xla_harness.hlo import alias as alias_rules
from xla_harness.hlo.compiler_alias import instruction_pairs
from xla_harness.hlo.ir import Computation, Instruction
from xla_harness.hlo.memplan.dataflow import OPERAND_HOLDERS, Flow, holds_operand_tuple
from xla_harness.hlo.memplan.model import Plan, io_alias, name_attr, operand, root
from xla_harness.hlo.memplan.values import Pos, indices
from xla_harness.hlo.timeline import called_in_order

Groups = list[list[int]]


def _ids(flow: Flow, positions: list[Pos]) -> list[int]:
    return [v for p in positions for v in flow.at(p)]


def while_rule(plan: Plan, flow: Flow) -> Groups:
    """a while's init, condition and body parameters, body root and result are one buffer"""
    m = plan.module
    out: Groups = []
    for _, ins in plan.tl.order:
        if ins.opcode != "while" or not ins.operands:
            continue
        cond, body = (m.by_name.get(name_attr(ins, k)) for k in ("condition", "body"))
        for idx in indices(ins.shape):
            ps: list[Pos] = [(ins.name, idx), operand(ins.operands[0], idx)]
            for c in (cond, body):
                if c is not None:
                    ps += [(p.name, idx) for p in c.instructions if p.opcode == "parameter"]
            if body is not None:
                ps.append((body.root.name, idx))
            out.append(_ids(flow, ps))
    return out


def _called_roots(plan: Plan, flow: Flow, opcode: str) -> Groups:
    out: Groups = []
    for _, ins in plan.tl.order:
        if ins.opcode == opcode:
            for idx in indices(ins.shape):
                out.append(_ids(flow, [(ins.name, idx)] + [(r.name, idx) for c in called_in_order(ins)
                                                          if (r := root(plan.module, c)) is not None]))
    return out


def conditional_rule(plan: Plan, flow: Flow) -> Groups:
    """a conditional's result and every branch's root are one buffer"""
    return _called_roots(plan, flow, "conditional")


def call_rule(plan: Plan, flow: Flow) -> Groups:
    """a call's result and its computation's root are one buffer"""
    return _called_roots(plan, flow, "call")


def async_rule(plan: Plan, flow: Flow) -> Groups:
    """an async start's result and its wrapped computation's root, and its done, are one buffer"""
    out: Groups = []
    for _, ins in plan.tl.order:
        if ins.opcode == "async-start" and ins.called and (r := root(plan.module, ins.called[0])) is not None:
            for idx in indices(r.shape):  # a tuple's table is each instruction's own
                if not r.shape.subshape(idx).is_tuple:
                    out.append(_ids(flow, [(ins.name, (1,) + idx), (r.name, idx)]))
    return out


def _pairs(plan: Plan, flow: Flow, pairs_of: Callable[[Computation, Instruction], list]) -> Groups:
    """Each (operand k, operand index, output index) pair of each instruction, as a group."""
    out: Groups = []
    for comp, ins in plan.tl.order:
        for k, oi, idx in pairs_of(comp, ins):
            if 0 <= k < len(ins.operands):
                out.append(_ids(flow, [(ins.name, idx), operand(ins.operands[k], oi)]))
    return out


def in_place_rule(plan: Plan, flow: Flow) -> Groups:
    """an in-place op's output (dynamic-update-slice, scatter, in-place fusions, collectives) shares its
    operand's buffer"""
    model = alias_rules.model("stock", plan.backend if plan.backend in alias_rules.BACKEND_RULES else "cpu")

    def pairs_of(comp: Computation, ins: Instruction) -> list:
        if ins.opcode == "fusion" and ins.called:
            try:
                found = alias_rules.discovered_pairs(plan.aliases, ins, model)
            except (HarnessError, KeyError, IndexError, ValueError):
                return []
            return [(p.operand_index, p.operand_shape_index, p.output_index) for p in found]
        if ins.opcode in OPERAND_HOLDERS and holds_operand_tuple(comp, ins):
            # a start that holds its operands at {0} (((operands), outputs)) states its in-place pair in
            # output_to_operand_aliasing; the opcode's own pair (output {} on operand 0) is the older form's
            return []
        return list(alias_rules.op_in_place_pairs(ins, comp))

    return _pairs(plan, flow, pairs_of)


def output_to_operand_aliasing_rule(plan: Plan, flow: Flow) -> Groups:
    """an output the instruction declares aliased to an operand"""
    return _pairs(plan, flow, lambda comp, ins: [(k, oi, out) for out, k, oi in ins.output_to_operand_aliasing()]
                  if "output_to_operand_aliasing" in ins.attr_text else [])


def _declared(plan: Plan, flow: Flow) -> Groups:
    return _pairs(plan, flow, lambda comp, ins: [(k, (), out) for k, out in instruction_pairs(ins) or ()])


def backend_aliasing_rule(plan: Plan, flow: Flow) -> Groups:
    """libtpu's aliasing_operands in backend_config, where the buffer assignment took it: the output on
    its operand's bytes (libtpu declares what may alias; two powers of one operand both name it)"""
    return [[ids[0]] + [o for o in ids[1:] if _meet(plan, ids[0], o)] for ids in _declared(plan, flow) if ids]


def aliasing_not_taken(plan: Plan, flow: Flow) -> int:
    """libtpu's declared aliasing the buffer assignment placed on other bytes."""
    return sum(not _meet(plan, ids[0], o) for ids in _declared(plan, flow) if ids for o in ids[1:])


def _meet(plan: Plan, a: int, b: int) -> bool:
    va, vb = plan.values[a], plan.values[b]
    return plan.allocation_of[a] == plan.allocation_of[b] and va.offset < vb.offset + vb.size \
        and vb.offset < va.offset + va.size


def donation_rule(plan: Plan, flow: Flow) -> Groups:
    """an entry parameter and the output it is donated to (input_output_alias)"""
    entry = plan.module.entry
    params = {p.parameter_number: p for p in entry.instructions if p.opcode == "parameter"}
    return [_ids(flow, [(entry.root.name, out), (p.name, pidx)])
            for out, (num, pidx) in io_alias(plan.module.input_output_alias) if (p := params.get(num)) is not None]


Rule = Callable[[Plan, Flow], Groups]
# Each rule by the name findings and --json use; its docstring says what it makes one buffer.
RULE_FUNCTIONS: dict[str, Rule] = {
    "while": while_rule, "conditional": conditional_rule, "call": call_rule, "async": async_rule,
    "in-place": in_place_rule, "output_to_operand_aliasing": output_to_operand_aliasing_rule,
    "backend-aliasing": backend_aliasing_rule, "donation": donation_rule,
}
RULES = {name: " ".join((fn.__doc__ or "").split()) for name, fn in RULE_FUNCTIONS.items()}


@dataclass(frozen=True)
class Buffers:
    """Which values are one buffer (:func:`group`): ``roots`` value id -> its buffer's smallest id."""

    roots: dict[int, int]
    rules_used: dict[str, int]  # rule -> values it joined to another buffer
    aliasing_not_taken: int

    def of(self, vid: int) -> int:
        return self.roots.get(vid, vid)


def group(plan: Plan, flow: Flow, disabled: frozenset[str] = frozenset()) -> Buffers:
    """Apply every rule but ``disabled`` (to show what each one prevents)."""
    parent: dict[int, int] = {}

    def find(a: int) -> int:
        p = parent.setdefault(a, a)
        while p != parent[p]:
            parent[p] = parent[parent[p]]
            p = parent[p]
        parent[a] = p
        return p

    used: dict[str, int] = {}
    for name, rule in RULE_FUNCTIONS.items():
        if name in disabled:
            continue
        for ids in rule(plan, flow):
            for other in ids[1:]:
                ra, rb = find(ids[0]), find(other)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
                    used[name] = used.get(name, 0) + 1
    return Buffers({vid: find(vid) for vid in plan.values}, dict(sorted(used.items())),
                   aliasing_not_taken(plan, flow) if "backend-aliasing" not in disabled else 0)
