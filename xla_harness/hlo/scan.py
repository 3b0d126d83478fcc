"""Scan compiled HLO for fusions whose in-place operand reaches a parameter through a
transpose or reshape, and classify each in-place fusion output:

``aliased``                 every policy pairs it with its parameter;
``layout-preserving-miss``  stock XLA misses the pair, the layout-aware policy finds it
                            (the transpose/reshape on the way is a bitcast under its layouts);
``hazard``                  only the as-reported policy pairs it: the way back to the parameter
                            goes through a transpose or reshape that moves data, so treating
                            it as in-place would let the emitter overwrite what it still reads.

"Stock" is the backend's own rule (cpu: bitcast is the only no-op; gpu: bitcast and every
reshape). The backend comes from ``--backend`` or the dump (file name, custom-call targets,
tiled layouts); for tpu, whose alias rules are closed, and for an unknown backend each
output is classified under both rules and the more severe class is reported.

A second, independent finding class, ``scatter-fused-with-data-moving-producer``: a fusion
whose scatter takes its in-place operand from a data-moving op inside the fusion (a
transpose or reshape that is not a bitcast under its layouts, a reverse, a layout-changing
copy) that reads a fusion parameter: the fusion XLA's patched ``ShouldFuseInPlaceOp``
no longer creates (the shape of jax-ml/jax#35409).

For a hazard the report also names, in the calling computation, the value feeding that
parameter and its other users (the tied-embedding pattern: the same buffer feeds a dot).
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.hlo import alias, compiler_alias
from xla_harness.hlo.buffers import BufferAssignment
from xla_harness.hlo.fusion_decisions import FUSION_DECISION_CLASS, FusionDecisionFinding, fusion_decision_findings
from xla_harness.hlo.ir import Computation, HloModule, Instruction, split_ref, users_index
from xla_harness.hlo.parser import parse_module
from xla_harness.table import format_rows

CLASSES = ("aliased", "layout-preserving-miss", "hazard")
DENSE_OPCODES = ("dot", "convolution")
BACKENDS = ("cpu", "gpu", "tpu", "unknown")
RULES_FOR_BACKEND = {"cpu": ("cpu",), "gpu": ("gpu",), "tpu": ("cpu", "gpu"), "unknown": ("cpu", "gpu")}


@dataclass
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
    classes: dict[str, str] = field(default_factory=dict)  # class under each backend rule considered
    output_path: list[str] = field(default_factory=list)  # opcodes from the fused root to root_opcode's op
    # What the compiler itself decided for this output, where it says (libtpu's backend_config
    # "aliasing_operands", or the buffer assignment: one slice for the operand and the output):
    # "aliased", "not-aliased", or "" when neither says; ``compiler_from`` names which said it.
    compiler: str = ""
    compiler_from: str = ""
    # Context for hazards (not part of the JSON schema): the caller's value feeding the
    # parameter and that value's other users.
    source: str = ""
    other_users: list[str] = field(default_factory=list)
    feeds_dense: bool = False

    @property
    def agreement(self) -> str:
        """The structural walk against the compiler's own decision: "agree", "disagree" or "" (the
        compiler does not say). The walk pairs an output with its parameter for every class but
        ``layout-preserving-miss`` under the stock rule; ``hazard`` means pairing it is wrong, so a
        compiler that aliases a hazard disagrees with the walk in the way #35409 describes."""
        if not self.compiler:
            return ""
        walk_aliases = self.cls == "aliased" or (self.cls == "layout-preserving-miss" and self.layout_aware)
        if self.cls == "hazard":
            return "disagree" if self.compiler == "aliased" else "agree"
        return "agree" if walk_aliases == (self.compiler == "aliased") else "disagree"

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("source", "other_users", "feeds_dense"):
            d.pop(k)
        d["class"] = d.pop("cls")
        if self.compiler:  # only where the compiler says (backend_config, buffer assignment)
            d["agreement"] = self.agreement
        else:
            del d["compiler"], d["compiler_from"]
        return d


def detect_backend(module: HloModule, filename: str = "") -> str:
    """cpu / gpu / tpu from the dump's file name or the module's content; 'unknown' otherwise."""
    name = Path(filename or module.filename).name.lower()
    for key, hints in (("tpu", ("tpu",)), ("gpu", ("gpu", "sm_", "cuda", "rocm")), ("cpu", ("cpu",))):
        if any(h in name for h in hints):
            return key
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.shape.layout_extra and "T(" in ins.shape.layout_extra:
                return "tpu"
            if ins.opcode == "custom-call" or "backend_config" in ins.attr_text:
                text = ins.attr_text
                if "__cublas" in text or "__cudnn" in text or "operation_queue_id" in text or "__triton" in text:
                    return "gpu"
                if "__onednn" in text or "xla.cpu" in text or "__xla_cpu" in text:
                    return "cpu"
    return "unknown"


def contains_dense(module: HloModule, ins: Instruction, depth: int = 0) -> bool:
    """Whether ``ins`` is a dense matrix product: a dot or convolution, a gemm/matmul custom call,
    or a fusion holding one (nested fusions followed four levels deep)."""
    if ins.opcode in DENSE_OPCODES:
        return True
    if ins.opcode == "custom-call" and ("gemm" in ins.attrs.get("custom_call_target", "").lower()
                                        or "matmul" in ins.attrs.get("custom_call_target", "").lower()):
        return True
    if ins.opcode == "fusion" and depth < 4:
        comp = module.by_name.get(ins.called[0]) if ins.called else None
        return comp is not None and any(contains_dense(module, i, depth + 1) for i in comp.instructions)
    return False


def _element(user: Instruction, ref: str) -> tuple[int, ...]:
    """The tuple element of the value a user reads through ``ref`` ('p#1', or gte(p), index=1)."""
    _, index = split_ref(ref)
    if user.opcode == "get-tuple-element" and not index:
        return (int(user.attrs.get("index", "0")),)
    return index


def _context(module: HloModule, caller_users: dict[str, list[Instruction]], fusion: Instruction, parameter: int
             ) -> tuple[str, list[str], bool]:
    """The caller's value feeding the fusion parameter and its other users (``caller_users``: the
    caller's :func:`~xla_harness.hlo.ir.users_index`): users of the same tuple element only
    (``name#k`` resolved), so a sibling element feeding a dot is not counted."""
    if parameter >= len(fusion.operands):
        return "", [], False
    source = fusion.operands[parameter]
    base, index = split_ref(source)
    users = []
    for u in caller_users.get(base, []):
        if u.name == fusion.name:
            continue
        for ref in u.operands:
            if split_ref(ref)[0] != base:
                continue
            elem = _element(u, ref)
            n = min(len(elem), len(index))
            if elem[:n] == index[:n]:
                users.append(u)
                break
    dense = any(contains_dense(module, u) for u in users)
    return source, [f"{u.name} ({u.opcode})" for u in users], dense


def _classify(analysis: alias.AliasAnalysis, fusion: Instruction, rule: str, table: dict, traced: dict
              ) -> dict[tuple[int, ...], tuple]:
    """output index -> (class, stock, proposed, layout-aware, pair) under one backend rule.
    ``table`` is the computation's effective-model table; ``traced`` holds the pairs by output
    index of each model traced so far (policies and rules that agree here are traced once)."""
    by_policy = []
    for p in alias.POLICIES:
        model = table[alias.model(p, rule)]
        pairs = traced.get(model)
        if pairs is None:
            pairs = traced[model] = _by_output(analysis, fusion, model)
        by_policy.append(pairs)
    stock_pairs, proposed_pairs, la_pairs = by_policy
    out = {}
    for index in {**stock_pairs, **proposed_pairs, **la_pairs}:
        stock = index in stock_pairs
        proposed = index in proposed_pairs
        la = index in la_pairs
        if stock:
            cls = "aliased"
        elif la and proposed:
            cls = "layout-preserving-miss"
        else:
            cls = "hazard"
        pair = proposed_pairs.get(index) or la_pairs.get(index) or stock_pairs[index]
        out[index] = (cls, stock, proposed, la, pair)
    return out


def _by_output(analysis: alias.AliasAnalysis, fusion: Instruction, model: alias.Model
               ) -> dict[tuple[int, ...], alias.InPlacePair]:
    """A fusion's in-place pairs under one effective model by output index (the last pair
    for an output wins, the annotated ones after the discovered ones)."""
    pairs = {pair.output_index: pair for pair in alias.discovered_pairs(analysis, fusion, model)}
    if "output_to_operand_aliasing" in fusion.attr_text:
        for out_index, op, op_index in fusion.output_to_operand_aliasing():
            pairs[out_index] = alias.InPlacePair(op, op_index, out_index, ())
    return pairs


def _compiler_verdict(caller: Computation, fusion: Instruction, buffers: BufferAssignment | None):
    """A function (operand, output index) -> ("aliased" | "not-aliased" | "", where it was said): the
    compiler's own decision, from libtpu's backend_config first, else the buffer assignment (one
    buffer slice for both); "" where neither says."""
    said = compiler_alias.instruction_pairs(fusion)
    if said is not None:
        pairs = set(said)
        return lambda k, out: ("aliased" if (k, out) in pairs else "not-aliased", compiler_alias.FROM_BACKEND_CONFIG)
    if buffers is not None:
        return lambda k, out: (compiler_alias.buffer_verdict(buffers, caller, fusion, k, out),
                               compiler_alias.FROM_BUFFER_ASSIGNMENT)
    return lambda k, out: ("", "")


# In-place ops whose pairs follow from the op, its operands' wiring and their shapes alone: a fused
# computation holding no other in-place op, no nested fusion and no annotation is classified once for
# every fusion of the module whose computation has the same structure (:func:`_structure`).
_MEMO_UNSAFE = (alias.IN_PLACE_OPCODES - {"scatter", "dynamic-update-slice"}) | {"fusion"}


def _structure(comp: Computation, fusion: Instruction) -> tuple | None:
    """All that the classification of ``fusion``'s outputs and its fusion decisions read of it and its
    computation, names replaced by positions: per instruction the opcode, shape, operand positions,
    ROOT mark, parameter number, transpose permutation and tuple index; the fusion's shape and operand
    count. None when the computation holds anything else they read (nested fusions, in-place ops
    other than scatter and dynamic-update-slice, whose pairs come from their operands alone, and
    ``name#k`` operands) or the fusion is annotated: such fusions are classified each on its own. Shapes are
    named by identity: equal shapes read apart only miss the memo, and every shape lives as long as
    the module (so no identity is reused while it is scanned)."""
    if "output_to_operand_aliasing" in fusion.attr_text:
        return None
    pos: dict[str, int] = {}
    parts: list = [id(fusion.shape), len(fusion.operands)]
    append = parts.append
    unsafe = _MEMO_UNSAFE
    k = 0
    for ins in comp.instructions:
        op = ins.opcode
        if op in unsafe:  # (an annotation on any other opcode is not read)
            return None
        if op == "parameter" and not ins.operands:
            append((op, id(ins.shape), (), ins.literal, ins.is_root))
            pos[ins.name] = k
            k += 1
            continue
        try:
            operands = tuple([pos[o] for o in ins.operands])
        except KeyError:  # 'name#k' (or not defined here): not memoised
            return None
        if op == "parameter":
            extra: object = ins.literal
        elif op == "transpose":
            t = ins.attr_text  # as XLA prints it, ', dimensions={1,0}, ...' (the attribute once): its text
            extra = t[14:t.find("}")] if t.startswith(", dimensions={") and t.count("dimensions=") == 1 \
                else ins.int_list("dimensions")
        elif op == "get-tuple-element":
            extra = ins.attrs.get("index", "0")
        else:
            extra = None
        append((op, id(ins.shape), operands, extra, ins.is_root))
        pos[ins.name] = k
        k += 1
    append(pos.get(comp.root.name))
    return tuple(parts)


def _classify_outputs(analysis: alias.AliasAnalysis, fusion: Instruction, backend: str) -> list[tuple]:
    """(output index, classes by rule, class, stock, proposed, layout-aware, pair, root opcode, output
    path) of every in-place output of the fusion: what does not depend on its caller."""
    rules = RULES_FOR_BACKEND[backend]
    table = alias.effective_table(analysis, fusion.called[0])
    traced: dict = {}
    per_rule: dict[str, dict] = {}
    for r in rules:  # rules that agree on this computation are classified once
        same = table[alias.model("proposed", r)].backend
        per_rule[r] = per_rule[same] if same in per_rule else _classify(analysis, fusion, r, table, traced)
    out = []
    for index in sorted({k for v in per_rule.values() for k in v}):
        classes = {r: per_rule[r][index][0] for r in rules if index in per_rule[r]}
        worst = max(classes, key=lambda r: CLASSES.index(classes[r]))
        cls, stock, proposed, la, pair = per_rule[worst][index]
        root, output_path = alias.output_source_path(analysis, fusion, index, "proposed", worst)
        out.append((index, classes, cls, stock, proposed, la, pair, root.opcode, output_path))
    return out


def scan_fusion(analysis: alias.AliasAnalysis, caller: Computation, fusion: Instruction, backend: str = "unknown",
                buffers: BufferAssignment | None = None, memo: dict | None = None,
                structure: tuple | None = None, ops: frozenset[str] | None = None,
                uses: dict[str, dict[str, list[Instruction]]] | None = None) -> list[Finding]:
    """The in-place outputs of ``fusion`` (called from ``caller``; ``analysis`` its module's) classified.
    ``memo`` with the fusion's
    :func:`_structure` reuses the classification of a fusion of the same structure; ``ops`` are
    :func:`alias.opcodes` of its computation when the caller has them; ``uses`` holds the
    :func:`~xla_harness.hlo.ir.users_index` of each computation by name, the caller's added when a
    hazard first needs it (a scan passes one for the whole module)."""
    if alias.IN_PLACE_OPCODES.isdisjoint(ops if ops is not None else alias.opcodes(analysis, fusion.called[0])) \
            and "output_to_operand_aliasing" not in fusion.attr_text:
        return []  # no in-place op anywhere in it and no annotation: no in-place output
    outputs = memo.get((structure, backend)) if memo is not None and structure is not None else None
    if outputs is None:
        outputs = _classify_outputs(analysis, fusion, backend)
        if memo is not None and structure is not None:
            memo[(structure, backend)] = outputs
    findings = []
    verdict = _compiler_verdict(caller, fusion, buffers)
    for index, classes, cls, stock, proposed, la, pair, root_opcode, output_path in outputs:
        if cls == "hazard":
            if uses is None:
                uses = {}
            caller_users = uses.get(caller.name)
            if caller_users is None:
                caller_users = uses[caller.name] = users_index(caller)
            source, users, dense = _context(analysis.module, caller_users, fusion, pair.operand_index)
        else:
            source, users, dense = "", [], False
        compiler, said_in = verdict(pair.operand_index, tuple(index)) if not pair.operand_shape_index else ("", "")
        findings.append(Finding(fusion.name, caller.name, root_opcode, list(index), pair.operand_index,
                                list(pair.operand_shape_index), list(pair.path), stock, proposed, la, cls,
                                dict(classes), list(output_path), compiler, said_in if compiler else "", source,
                                users, dense))
    return findings


def scan_module(module: HloModule, backend: str = "auto") -> list[Finding]:
    """Every in-place fusion output of the module, classified."""
    return scan(module, backend)[0]


def scan(module: HloModule, backend: str = "auto", buffers: BufferAssignment | None = None, *,
         memo: bool = True) -> tuple[list[Finding], list[FusionDecisionFinding], str]:
    """In-place fusion outputs classified, fusion-decision findings, and the backend used. With the
    module's ``buffers`` (its buffer assignment) each output also carries the compiler's own decision
    where the module's backend configs do not state one (the GPU and CPU compilers). ``memo=False``
    classifies every fusion on its own (the answer is the same; tests compare the two)."""
    if backend == "auto":
        backend = detect_backend(module)
    if backend not in BACKENDS:
        raise HarnessError(f"unknown backend {backend!r}; expected auto or one of {', '.join(BACKENDS)}")
    findings: list[Finding] = []
    decisions: list[FusionDecisionFinding] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()  # many small acyclic objects; collecting while scanning only costs time
    try:
        # A nested fusion's scatters are judged once, from the outermost fusion (its walk goes into them).
        fusions = [(c, i) for c in module.computations for i in c.instructions if i.opcode == "fusion" and i.called]
        fused = {i.called[0] for _, i in fusions}
        by_structure: dict = {}  # classifications by fused-computation structure (repeated layers read once)
        uses: dict[str, dict[str, list[Instruction]]] = {}  # users_index of each caller a hazard is in
        numbers: dict[tuple, tuple[int]] = {}  # each structure as a small key (hashed once, not per lookup)
        in_place = alias.IN_PLACE_OPCODES
        analysis = alias.analyze(module)
        for comp, ins in fusions:
            ops = alias.opcodes(analysis, ins.called[0])
            structure = None
            if memo and not in_place.isdisjoint(ops) and "fusion" not in ops:
                found = _structure(module.computation(ins.called[0]), ins)
                if found is not None:
                    structure = numbers.setdefault(found, (len(numbers),))
            findings.extend(scan_fusion(analysis, comp, ins, backend, buffers, by_structure, structure, ops, uses))
            if comp.name not in fused:
                decisions.extend(fusion_decision_findings(analysis, comp, ins, backend, by_structure, structure, ops))
    finally:
        if gc_was_enabled:
            gc.enable()
    return findings, decisions, backend


def scan_text(text: str, backend: str = "auto", filename: str = "<string>"
              ) -> tuple[list[Finding], list[FusionDecisionFinding], str]:
    """:func:`scan` of one module's HLO text (as XLA, libtpu or the GPU compiler print it)."""
    return scan(parse_module(text, filename), backend)


def module_json(module: HloModule, findings: list[Finding], decisions: list[FusionDecisionFinding] | None = None,
                backend: str | None = None) -> dict:
    if decisions is None or backend is None:
        _, decisions, backend = scan(module)
    return {"module": module.name, "backend": backend, "findings": [f.to_json() for f in findings],
            "fusion_decisions": [d.to_json() for d in decisions]}


def format_findings(module: HloModule, findings: list[Finding], show_aliased: bool = False,
                    decisions: list[FusionDecisionFinding] | None = None, backend: str = "") -> str:
    """Human table of one module's findings (aliased ones summarised unless asked for)."""
    counts = {c: sum(f.cls == c for f in findings) for c in CLASSES}
    rules = " and ".join(RULES_FOR_BACKEND.get(backend, ()))
    lines = [f"{module.name} ({module.filename}): {module.instruction_count()} instructions"
             + (f", backend {backend} (alias rules: {rules})" if backend else "")
             + f", {counts['hazard']} hazard, {counts['layout-preserving-miss']} layout-preserving-miss, "
             f"{counts['aliased']} aliased, {len(decisions or [])} {FUSION_DECISION_CLASS}"]
    said = [f for f in findings if f.compiler]
    if said:
        disagree = [f for f in said if f.agreement == "disagree"]
        sources = " and ".join(sorted({f.compiler_from for f in said}))
        lines.append(f"  the compiler's own aliasing ({sources}) agrees with the walk on "
                     f"{len(said) - len(disagree)} of {len(said)} in-place output(s)")
        for f in disagree:
            lines.append(f"  disagreement: {f.fusion} output {tuple(f.output_index)} <- parameter {f.parameter}: "
                         f"walk says {f.cls}, the compiler {f.compiler}"
                         + ("  <- the compiler writes in place through a data-moving op" if f.cls == "hazard"
                            else ""))
    for d in decisions or []:
        lines.append(f"  {FUSION_DECISION_CLASS}: {d.fusion} in {d.computation}: {d.scatter} takes operand "
                     f"{d.operand} from {d.producer}, which reads parameter {d.parameter} "
                     f"({' <- '.join(d.path)}): the fusion decision should not have fused it")
    shown = [f for f in findings if show_aliased or f.cls != "aliased"]
    if shown:
        head = ("class", "fusion", "computation", "root", "out", "param", "path", "stock/proposed/layout",
                "by rule", "compiler")
        rows = []
        for f in shown:
            rows.append((f.cls, f.fusion, f.computation, " <- ".join([*f.output_path, f.root_opcode]),
                         str(tuple(f.output_index)),
                         f"{f.parameter}{tuple(f.parameter_index) if f.parameter_index else ''}",
                         " <- ".join(f.path) or "(parameter)",
                         "/".join("y" if b else "n" for b in (f.stock, f.proposed, f.layout_aware)),
                         " ".join(f"{r}:{c}" for r, c in f.classes.items()), f.compiler or "-"))
        lines += format_rows(rows, header=head, indent="  ", rule=False)
        for f in shown:
            if f.cls == "hazard" and f.source:
                users = ", ".join(f.other_users) or "none"
                lines.append(f"  hazard {f.fusion}: parameter {f.parameter} is {f.source} in "
                             f"{f.computation}; its other users: {users}"
                             + ("  <- also feeds a dot (tied-embedding pattern)" if f.feeds_dense else ""))
    return "\n".join(lines)
