"""A model of XLA's in-place input/output pairing for fusion instructions.

Modelled on ``AliasInfo::GetFusionInstructionInPlaceInputOutputPairs`` and
``AliasInfo::GetInPlaceInputOutputPairs`` in openxla/xla ``xla/hlo/analysis/alias_info.cc``
(read at 183fa00cb5, 2026-08-22). For every leaf output of a fusion: start at the fused
root, follow tuple/get-tuple-element indirections and then no-op indirections back to the
"output source"; take that instruction's in-place pairs (for a nested fusion only the pairs
discovered in its body, not its ``output_to_operand_aliasing`` annotation); follow the
in-place operand back the same way, peepholing through a nested fusion's pairs; if a fusion
parameter is reached, that parameter and the output are an in-place pair.
``output_to_operand_aliasing`` pairs of the fusion itself are added as annotated.

In-place ops (upstream's list): scatter, dynamic-update-slice, all-reduce-start,
collective-permute(-start) with 4 operands (operand 1), ragged-all-to-all (operand 1),
set-dimension-size, custom-call / async-start / async-update by annotation, async-done
through its chain's async-start annotation.

Which instructions count as no-op indirections depends on the backend (upstream's virtual
``AliasInfo::IsNoOpForAliasAnalysis``): ``cpu`` bitcast only (the base class); ``gpu``
bitcast and every reshape (``GpuAliasInfo``). On top of that, the policy:

``stock``         the backend's rule as upstream has it;
``proposed``      also every transpose and reshape, whatever their layouts (openxla/xla#38607);
``layout-aware``  also transposes/reshapes that are bitcasts under their operand and result
                  layouts (XLA's default descending layout when none is printed), as
                  :mod:`xla_harness.hlo.bitcast` decides.
"""

from __future__ import annotations

from typing import NamedTuple

from xla_harness.errors import HarnessError
from xla_harness.hlo.bitcast import BitcastDecisions
from xla_harness.hlo.ir import Computation, HloModule, Instruction
from xla_harness.hlo.shapes import Shape

POLICIES = ("stock", "proposed", "layout-aware")
BACKEND_RULES = ("cpu", "gpu")  # whose IsNoOpForAliasAnalysis: bitcast / bitcast + reshape


class InPlacePair(NamedTuple):
    operand_index: int  # fusion operand (= fused parameter) number
    operand_shape_index: tuple[int, ...]
    output_index: tuple[int, ...]
    path: tuple[str, ...] = ()  # opcodes walked from the in-place operand back to the parameter


def is_noop(ins: Instruction, comp: Computation, policy: str, backend: str, bitcasts: BitcastDecisions) -> bool:
    """Is ``ins`` a no-op indirection under ``policy`` on top of ``backend``'s rule (layout-aware:
    as ``bitcasts`` decides)."""
    if ins.opcode == "bitcast":
        return True
    if ins.opcode == "reshape" and backend == "gpu" and ins.operands:
        return True
    if ins.opcode in ("transpose", "reshape") and ins.operands:
        if policy == "proposed":
            return True
        if policy == "layout-aware":
            return bitcasts.is_bitcast_equivalent(ins, comp)
    return False


# ----------------------------------------------------------------------------- tracing


class Model(NamedTuple):
    """One alias model: a policy on top of a backend's no-op rule."""

    policy: str = "stock"
    backend: str = "cpu"


def _follow(comp: Computation, ins: Instruction, index: tuple[int, ...], model: Model,
            path: list[str], bitcasts: BitcastDecisions) -> tuple[Instruction, tuple[int, ...]]:
    """Tuple indirections, then no-op indirections (as upstream's follow_indirections)."""
    while ins.opcode == "tuple" and index:
        (ins, k), index = comp.operand(ins.operands[index[0]]), index[1:]
        index = k + index
        path.append("tuple")
    while ins.opcode == "get-tuple-element":
        index = (int(ins.attrs.get("index", "0")),) + index
        path.append("get-tuple-element")
        ins, k = comp.operand(ins.operands[0])
        index = k + index
    while not index and is_noop(ins, comp, model.policy, model.backend, bitcasts):
        path.append(ins.opcode)
        ins, index = comp.operand(ins.operands[0])
    return ins, index


Pair = tuple[int, tuple[int, ...], tuple[int, ...]]  # (operand number, operand index, output index)


def _default_pairs(n: int) -> list[Pair]:
    return [(0, (), ())] if n == 1 else [(i, (), (i,)) for i in range(n)]


def _annotated(ins: Instruction) -> list[Pair]:
    if "output_to_operand_aliasing" not in ins.attr_text:
        return []
    return [(op, op_idx, out) for out, op, op_idx in ins.output_to_operand_aliasing() if op >= 0]


def _collective_permute_pairs(ins: Instruction, comp: Computation | None, start: bool) -> list[Pair]:
    """In-place collective-permute (4 operands: input, output buffer, offsets): operand 1."""
    if len(ins.operands) != 4:
        return []
    out = (1,) if start else ()
    pairs: list[Pair] = [(1, (), out)]
    if comp is not None:
        src, k = comp.operand(ins.operands[1])
        shape = src.shape.subshape(k)
        if shape.tuple_shapes is not None:
            pairs += [(1, (i,), out + (i,)) for i in range(len(shape.tuple_shapes))]
    return pairs


def _async_pairs(ins: Instruction, comp: Computation | None) -> list[Pair]:
    if ins.opcode == "async-start":
        if not ins.operands:
            return []
        return [(op, op_idx, out) for op, op_idx, out in _annotated(ins)
                if out and op < len(ins.operands) and _index_valid(ins.shape, out)]
    if ins.opcode == "async-update":
        return _annotated(ins)
    # async-done: result-to-parameter aliasing of the chain's async-start
    start = ins
    seen = 0
    while comp is not None and start.opcode in ("async-done", "async-update") and start.operands and seen < 10_000:
        start = comp.operand(start.operands[0])[0]
        seen += 1
    if start.opcode != "async-start":
        return []
    pairs = []
    for out, op, op_idx in start.output_to_operand_aliasing():
        if out and out[0] == 1 and _index_valid(ins.shape, out[1:]):
            pairs.append((0, (0, op) + op_idx, out[1:]))
    return pairs


def _index_valid(shape: Shape, index: tuple[int, ...]) -> bool:
    try:
        shape.subshape(index)
    except IndexError:
        return False
    return True


def op_in_place_pairs(ins: Instruction, comp: Computation | None = None) -> list[Pair]:
    """In-place pairs of a non-fusion instruction (upstream's GetInPlaceInputOutputPairs)."""
    op = ins.opcode
    if op == "scatter":
        return _default_pairs((len(ins.operands) - 1) // 2)
    if op == "dynamic-update-slice":
        return [(0, (), ())]
    if op == "all-reduce-start":
        return _default_pairs(len(ins.operands))
    if op in ("collective-permute", "collective-permute-start"):
        return _collective_permute_pairs(ins, comp, op.endswith("-start"))
    if op == "custom-call":
        return _annotated(ins)
    if op in ("async-start", "async-update", "async-done"):
        return _async_pairs(ins, comp)
    if op == "set-dimension-size":
        return [(0, (), ())]
    if op == "ragged-all-to-all":
        return [(1, (), ())]
    return []


_MODELS = {(p, b): Model(p, b) for p in POLICIES for b in BACKEND_RULES}  # made once: NamedTuple() is slow
_ALL_MODELS = tuple(_MODELS.values())


# Opcodes that have in-place pairs of their own (op_in_place_pairs); a fusion whose body holds
# none of them, nested fusions included, and which has no annotation has no in-place pair.
IN_PLACE_OPCODES = frozenset(("scatter", "dynamic-update-slice", "all-reduce-start", "collective-permute",
                              "collective-permute-start", "custom-call", "async-start", "async-update",
                              "async-done", "set-dimension-size", "ragged-all-to-all"))


class AliasAnalysis:
    """What the alias model derives from one module, each answer computed once (made by
    :func:`analyze`, then handed to whatever asks about the module's fusions): per computation
    its opcodes (nested fusions included) and its table of effective models, per fused
    computation and model the pairs its body shows, and the bitcast decisions of the
    layout-aware policy. The answers are the module's as it was when asked: a module changed
    afterwards needs a new analysis."""

    __slots__ = ("bitcasts", "module", "results", "tables")

    def __init__(self, module: HloModule) -> None:
        self.module = module
        self.bitcasts = BitcastDecisions()
        # ("ops", computation) -> opcodes; ("effective", computation) -> model table;
        # (fused computation, model) -> discovered pairs; (fused computation, model, "visiting") -> True
        self.results: dict = {}
        self.tables: dict[tuple, dict[Model, Model]] = {}  # effective tables by what they depend on (a few)


def analyze(module: HloModule) -> AliasAnalysis:
    """The alias analysis of ``module``, empty: each answer is computed when first asked for."""
    return AliasAnalysis(module)


def opcodes(analysis: AliasAnalysis, comp_name: str) -> frozenset[str]:
    """The opcodes of a computation and of the fusions nested in it (computed for every
    computation of the module on first use, callees first)."""
    module = analysis.module
    cache = analysis.results
    ops = cache.get(("ops", comp_name))
    if ops is None:
        for comp in module.computations:
            own = {i.opcode for i in comp.instructions}
            for i in comp.instructions:
                if i.opcode == "fusion" and i.called:
                    own |= cache.get(("ops", i.called[0]), set())
            cache[("ops", comp.name)] = frozenset(own)
        ops = cache.get(("ops", comp_name), frozenset())
    return ops


def _effective_table(analysis: AliasAnalysis, comp_name: str) -> dict[Model, Model]:
    """Every model -> the simplest one with the same pairs here, computed once per computation."""
    module = analysis.module
    ops = opcodes(analysis, comp_name)
    # layout-aware is proposed when every transpose/reshape here is a bitcast, stock when none is
    layout_aware_as = "layout-aware"
    if "fusion" not in ops and ("transpose" in ops or "reshape" in ops):
        comp = module.computation(comp_name)
        bitcasts = {analysis.bitcasts.is_bitcast_equivalent(i, comp) for i in comp.instructions
                    if (i.opcode == "transpose" or i.opcode == "reshape") and i.operands}
        if len(bitcasts) == 1:
            layout_aware_as = "proposed" if True in bitcasts else "stock"
    key = ("reshape" in ops, "transpose" in ops, layout_aware_as)
    table = analysis.tables.get(key)
    if table is None:
        table = analysis.tables[key] = {}
        for model in _ALL_MODELS:
            policy, backend = model
            if "reshape" not in ops:
                backend = "cpu"
                if "transpose" not in ops:
                    policy = "stock"
            if policy == "layout-aware":
                policy = layout_aware_as
            table[model] = _MODELS[policy, backend]
    return table


def effective_table(analysis: AliasAnalysis, comp_name: str) -> dict[Model, Model]:
    """Every model -> the simplest one giving this computation the same pairs (cached): without
    reshapes (nested fusions included) the backend rules agree; without transposes and
    reshapes the policies do; layout-aware is proposed or stock when every transpose and
    reshape here is, or none is, a bitcast."""
    cache = analysis.results
    table = cache.get(("effective", comp_name))
    if table is None:
        table = cache[("effective", comp_name)] = _effective_table(analysis, comp_name)
    return table


def model(policy: str, backend: str) -> Model:
    return _MODELS[policy, backend]


def discovered_pairs(analysis: AliasAnalysis, fusion: Instruction, model: Model) -> list[InPlacePair]:
    """The pairs a fusion's body shows under ``model`` (an effective model, as
    ``effective_table`` gives), without the fusion's own annotation; cached, do not modify."""
    cache = analysis.results
    key = (fusion.called[0], model)
    found = cache.get(key)
    if found is None:
        ops = cache.get(("ops", key[0]))
        if ops is not None and "fusion" not in ops:  # nothing nested: trace this one directly
            found = cache[key] = _discover(analysis, analysis.module.computation(key[0]), fusion, model)
        else:
            _ensure_nested(analysis, fusion, model)
            found = cache[key]
    return found


def _ensure_nested(analysis: AliasAnalysis, fusion: Instruction, model: Model) -> None:
    """Compute the pairs of every fusion nested under ``fusion`` first, innermost first,
    with an explicit stack (no recursion, whatever the nesting depth)."""
    module = analysis.module
    cache = analysis.results
    if (fusion.called[0], model) in cache:
        return
    stack = [fusion]
    while stack:
        top = stack[-1]
        comp = module.computation(top.called[0])
        pending = [i for i in comp.instructions if i.opcode == "fusion" and i.called
                   and (i.called[0], model) not in cache]
        if pending and (top.called[0], model, "visiting") not in cache:
            cache[(top.called[0], model, "visiting")] = True
            stack.extend(pending)
            continue
        stack.pop()
        if (top.called[0], model) not in cache:
            cache[(top.called[0], model)] = _discover(analysis, comp, top, model)


def _output_source_pairs(analysis: AliasAnalysis, ins: Instruction, model: Model, comp: Computation) -> list[Pair]:
    """Pairs of an output source: a nested fusion contributes only what its body shows."""
    if ins.opcode == "fusion":
        return [(p.operand_index, p.operand_shape_index, p.output_index)
                for p in analysis.results[(ins.called[0], model)]]
    return op_in_place_pairs(ins, comp)


def _nested_pairs(analysis: AliasAnalysis, ins: Instruction, model: Model) -> list[Pair]:
    """A nested fusion's public pairs: discovered plus annotated."""
    found = [(p.operand_index, p.operand_shape_index, p.output_index)
             for p in analysis.results[(ins.called[0], model)]]
    return found + _annotated(ins)


def _discover(analysis: AliasAnalysis, comp: Computation, fusion: Instruction, model: Model) -> list[InPlacePair]:
    out: list[InPlacePair] = []
    bitcasts = analysis.bitcasts
    for index, _ in fusion.shape.leaves():
        src, src_index = _follow(comp, comp.root, index, model, [], bitcasts)
        found: tuple[Instruction, tuple[int, ...], list[str]] | None = None
        for op_num, op_index, out_index in _output_source_pairs(analysis, src, model, comp):
            if out_index != src_index or op_num >= len(src.operands):
                continue
            path: list[str] = []
            first, k = comp.operand(src.operands[op_num])
            inp, inp_index = _follow(comp, first, k + op_index, model, path, bitcasts)
            if inp.opcode == "fusion" and inp.called:  # peephole through a nested fusion's pairs
                for n_op, n_op_index, n_out in _nested_pairs(analysis, inp, model):
                    if n_out == inp_index and n_op < len(inp.operands):
                        path.append("fusion")
                        nxt, k = comp.operand(inp.operands[n_op])
                        inp, inp_index = _follow(comp, nxt, k + n_op_index, model, path, bitcasts)
                        break
            found = (inp, inp_index, path)
        if found is not None and found[0].opcode == "parameter":
            inp, inp_index, path = found
            out.append(InPlacePair(inp.parameter_number, inp_index, index, tuple(path)))
    return out


def fusion_in_place_pairs(analysis: AliasAnalysis, fusion: Instruction, policy: str, backend: str = "cpu"
                          ) -> list[InPlacePair]:
    """In-place (operand, operand index) -> output index pairs of a fusion under ``policy`` and
    ``backend``'s no-op rule, discovered pairs first, then the annotated ones."""
    if policy not in POLICIES:
        raise HarnessError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if backend not in BACKEND_RULES:
        raise HarnessError(f"unknown backend rule {backend!r}; expected one of {', '.join(BACKEND_RULES)}")
    if fusion.opcode != "fusion" or not fusion.called:
        raise HarnessError(f"{fusion.name} is not a fusion instruction")
    model = effective_table(analysis, fusion.called[0])[_MODELS[policy, backend]]
    _ensure_nested(analysis, fusion, model)
    out = list(analysis.results[(fusion.called[0], model)])
    if "output_to_operand_aliasing" in fusion.attr_text:
        for out_index, op, op_index in fusion.output_to_operand_aliasing():
            out.append(InPlacePair(op, op_index, out_index, ()))
    return out


def output_source_path(analysis: AliasAnalysis, fusion: Instruction, index: tuple[int, ...], policy: str,
                       backend: str = "cpu") -> tuple[Instruction, list[str]]:
    """The output source and the opcodes walked to it from the fused root (tuple,
    get-tuple-element, no-ops), root first."""
    comp = analysis.module.computation(fusion.called[0])
    path: list[str] = []
    return _follow(comp, comp.root, index, _MODELS[policy, backend], path, analysis.bitcasts)[0], path
