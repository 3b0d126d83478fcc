"""What one compiler made of the step: a compiled module read into the verdicts ``triage`` reports
per target. Pure functions over :class:`xla_harness.hlo.ir.HloModule` and a compile record, and a
compile stage's record read back into its target's verdict (:func:`verdict_of_record`: the module
and buffer assignment it names, parsed; the alias rules of the compiler that made it).

Per target: the hazard verdict (the scanner's walk, with the compiler's own aliasing as the truth
where the compiler states it: libtpu's ``backend_config``, the GPU/CPU buffer assignment), fusions
that fused a data-moving producer into a scatter's in-place operand, every in-place scatter fusion
with its in-place operand's path, the compiler's verdict on it and the scatter's source line, which
of them writes the tied matrix W's gradient and into what (the dense gradient, a zero broadcast...),
the instructions the target runs non-deterministically, and a small graph of each in-place
scatter's compiled neighbourhood.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xla_harness.hlo.fusion_decisions import FUSION_DECISION_CLASS
from xla_harness.hlo.ir import Computation, HloModule, Instruction, users_index
from xla_harness.hlo.nondeterminism import ASSESSED, SourceLines, nondeterministic_ops, source_of
from xla_harness.hlo.scan import scan
from xla_harness.hlo.tied import tied_summary


@dataclass
class ScatterFusion:
    fusion: str
    computation: str
    scatter: str  # the scatter inside it (its root, or on the way to the root)
    in_place_parameter: int
    path: list[str]  # opcodes from the scatter's in-place operand back to the fusion parameter
    cls: str  # the scanner's class (aliased, hazard, layout-preserving-miss)
    compiler: str  # what the compiler says it did ("aliased", "not-aliased", "" when it does not say)
    source: str  # the scatter's source frames, "" when the dump has none
    writes_w: str = ""  # for W's gradient scatter: where its in-place buffer comes from (dense, broadcast, ...)


@dataclass
class Node:
    name: str
    label: str
    role: str  # fusion | operand | producer | user


@dataclass
class Neighbourhood:
    fusion: str
    nodes: list[Node]
    edges: list[tuple[str, str, str]]  # (from, to, label); the in-place operand's edge is labelled "in place"


@dataclass
class TargetVerdict:
    target: str
    backend: str
    versions: dict
    instructions: int
    hazard: int
    fused_producer: int  # scatters fused with the data-moving producer of their in-place operand
    hazard_fusions: list[str]
    decision_fusions: list[str]
    scatters: list[ScatterFusion]
    compiler_states_aliasing: bool
    disagreements: int
    nondeterministic: list[dict] | None  # None: the target's compiler is not assessed
    w_dims: list[int] | None
    neighbourhoods: list[Neighbourhood] = field(default_factory=list)
    compile_cpu_s: float | None = None
    devices: int | None = None  # the devices the step was compiled for
    target_devices: int | None = None  # the devices the target has (a factory without devices= compiles for 1)
    # memcheck of the compiled module (:func:`memory_plan`): {"values", "async_windows", "conflicts",
    # "kinds", "first", "live_range_compared", "disagreements"} or {"error"}; None: not checked
    memory_plan: dict | None = None

    @property
    def found(self) -> bool:
        return bool(self.hazard or self.fused_producer or self.memory_conflicts)

    def scope(self) -> str:
        """"compiled for 1 of 8 devices" where an ahead-of-time target's step covers fewer devices than the
        target has, else ""."""
        if self.target == "host" or self.devices is None or self.target_devices is None \
                or self.devices >= self.target_devices:
            return ""  # the host runs the program's own device count, by design
        return f"compiled for {self.devices} of {self.target_devices} devices"

    @property
    def memory_conflicts(self) -> int:
        """Races memcheck found (two live values on the same bytes, a read after an in-place write, an
        async window touched). A live range that differs from the compiler's is not one: it is our
        model's error or the compiler's, said apart (docs/memcheck.md)."""
        return int((self.memory_plan or {}).get("conflicts", 0))

    def w_scatter(self) -> ScatterFusion | None:
        return next((s for s in self.scatters if s.writes_w), None)

    def to_json(self) -> dict:
        return asdict(self)


def _scatter_in(module: HloModule, caller: str, fusion: str, depth: int = 0) -> Instruction | None:
    """The scatter a fusion runs (its root's, else the first inside it or a nested fusion)."""
    comp = module.by_name.get(caller)
    ins = comp.by_name.get(fusion) if comp is not None else None
    fused = module.by_name.get(ins.called[0]) if ins is not None and ins.called else None
    if fused is None:
        return None
    if fused.root.opcode == "scatter":
        return fused.root
    found = next((i for i in fused.instructions if i.opcode == "scatter"), None)
    if found is None and depth < 4:
        for nested in (i for i in fused.instructions if i.opcode == "fusion"):
            found = _scatter_in(module, fused.name, nested.name, depth + 1)
            if found is not None:
                break
    return found


def _label(ins: Instruction, module: HloModule) -> str:
    op = ins.opcode
    if op == "fusion" and ins.called:
        called = module.by_name.get(ins.called[0])
        root = called.root.opcode if called is not None else "?"
        op = f"fusion ({ins.fusion_kind or '?'}; root {root})"
    return f"{ins.name}\n{op}\n{ins.shape}"


def neighbourhood(module: HloModule, comp: Computation, fusion: Instruction, in_place: int,
                  depth: int = 2) -> Neighbourhood:
    """The fusion, its operands' producers ``depth`` levels up, and its users, as a small graph."""
    nodes = {fusion.name: Node(fusion.name, _label(fusion, module), "fusion")}
    edges: list[tuple[str, str, str]] = []
    frontier = [fusion]
    for level in range(depth):
        nxt = []
        for ins in frontier:
            for i, ref in enumerate(ins.operands):
                try:
                    producer, _ = comp.operand(ref)
                except (KeyError, ValueError):
                    continue
                label = "in place" if ins is fusion and i == in_place else (f"operand {i}" if ins is fusion else "")
                edges.append((producer.name, ins.name, label))
                if producer.name not in nodes:
                    nodes[producer.name] = Node(producer.name, _label(producer, module),
                                                "operand" if level == 0 else "producer")
                    nxt.append(producer)
        frontier = nxt
    for user in users_index(comp).get(fusion.name, [])[:4]:
        nodes.setdefault(user.name, Node(user.name, _label(user, module), "user"))
        edges.append((fusion.name, user.name, ""))
    return Neighbourhood(fusion.name, list(nodes.values()), edges)


def target_verdict(module: HloModule, target: str, backend: str = "auto", record: dict | None = None,
                   w_dims: tuple[int, int] | None = None, buffers=None, graphs: int = 4) -> TargetVerdict:
    """The verdicts of one compiled module (``record``: its compile record, for the versions and the
    compile time; ``w_dims``: the tied matrix's shape, for which scatter writes its gradient)."""
    findings, decisions, used = scan(module, backend, buffers)
    lines = SourceLines(module.source_tables)
    sites = {}
    if w_dims is not None:
        for site in tied_summary(module, (int(w_dims[0]), int(w_dims[1]))).scatters:
            sites[site.fusion or site.scatter] = site.in_place_source
    scatters, graphs_out = [], []
    for f in findings:
        scatter = _scatter_in(module, f.computation, f.fusion)
        if scatter is None:
            continue
        scatters.append(ScatterFusion(f.fusion, f.computation, scatter.name, f.parameter, list(f.path), f.cls,
                                      f.compiler, source_of(scatter, lines), sites.get(f.fusion, "")))
    for s in scatters[:graphs]:
        comp = module.by_name.get(s.computation)
        if comp is not None and s.fusion in comp.by_name:
            graphs_out.append(neighbourhood(module, comp, comp.by_name[s.fusion], s.in_place_parameter))
    said = [f for f in findings if f.compiler]
    nondet = None
    if used in ASSESSED:
        nondet = [op.to_json() for op in nondeterministic_ops(module, used)]
    record = record or {}
    return TargetVerdict(
        target=target, backend=used, versions=dict(record.get("versions") or {}),
        instructions=module.instruction_count(), hazard=sum(f.cls == "hazard" for f in findings),
        fused_producer=sum(d.cls == FUSION_DECISION_CLASS for d in decisions),
        hazard_fusions=sorted({f.fusion for f in findings if f.cls == "hazard"}),
        decision_fusions=sorted({d.fusion for d in decisions}), scatters=scatters,
        compiler_states_aliasing=bool(said), disagreements=sum(f.agreement == "disagree" for f in said),
        nondeterministic=nondet, w_dims=list(w_dims) if w_dims is not None else None, neighbourhoods=graphs_out,
        compile_cpu_s=record.get("compile_cpu_s"), devices=_count(record.get("devices")),
        target_devices=_count(record.get("target_devices")))


def memory_plan(module_path: Path) -> dict:
    """memcheck's verdict on a compiled module (its buffer assignment and live range beside it), as a
    verdict records it; {"error": ...} when it cannot be checked."""
    from xla_harness.errors import HarnessError
    from xla_harness.hlo.memplan import check_files

    try:
        report = check_files(module_path)
    except HarnessError as exc:
        return {"error": str(exc)}
    kinds: dict[str, int] = {}
    for f in report.conflicts:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    return {"values": report.values, "async_windows": report.async_windows, "conflicts": len(report.conflicts),
            "kinds": kinds, "first": report.conflicts[0].message if report.conflicts else "",
            "live_range_compared": report.live_range_compared, "disagreements": len(report.disagreements)}


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _conform(value, hint, where: str) -> None:
    """``value`` (read from JSON) has the type ``hint`` (a field's annotation); ValueError naming
    ``where`` otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return
        return _conform(value, next(a for a in args if a is not type(None)), where)
    if dataclasses.is_dataclass(hint):
        return _conform_object(value, hint, where)
    want = origin or hint
    if want in (list, tuple):
        want = list  # JSON has no tuples; a record not yet written has them
        ok = isinstance(value, list | tuple)
    else:
        ok = isinstance(value, want) and not (isinstance(value, bool) and want in (int, float))
    if want is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise ValueError(f"{where} is {type(value).__name__}, not {getattr(want, '__name__', want)}")
    if want is list and args:
        for i, item in enumerate(value):
            _conform(item, args[0] if origin is list else args[min(i, len(args) - 1)], f"{where}[{i}]")


def _conform_object(value, cls, where: str) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{where} is {type(value).__name__}, not an object")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in value:
            _conform(value[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where} lacks {f.name}")
    unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"{where} has unknown field {unknown[0]}")


def verdict_from_json(d) -> TargetVerdict:
    """A :class:`TargetVerdict` read back from :meth:`TargetVerdict.to_json` (``triage.json``); a
    record of another shape is a ValueError naming its first wrong field."""
    _conform(d, TargetVerdict, "verdict")
    d = dict(d)
    d["scatters"] = [ScatterFusion(**s) for s in d.get("scatters", [])]
    d["neighbourhoods"] = [Neighbourhood(n["fusion"], [Node(**x) for x in n["nodes"]],
                                         [tuple(e) for e in n["edges"]]) for n in d.get("neighbourhoods", [])]
    return TargetVerdict(**d)


def verdict_of_record(record: dict, folder: Path, target: str) -> TargetVerdict:
    from xla_harness.hlo.buffers import load_buffer_assignment
    from xla_harness.hlo.parser import parse_file

    hlo = folder / record["hlo"]
    module = parse_file(hlo)
    ba_path = Path(str(hlo).replace(".after_optimizations.txt", ".after_optimizations-buffer-assignment.txt"))
    buffers = load_buffer_assignment(ba_path) if ba_path.is_file() else None
    leaf = record.get("target_leaf") or {}
    verdict = None
    for key in ("shard_shape", "shape"):  # a sharded step holds one device's shard of W
        shape = leaf.get(key)
        w_dims = (int(shape[0]), int(shape[1])) if isinstance(shape, list) and len(shape) == 2 else None
        verdict = target_verdict(module, target, record_rules(record), record, w_dims, buffers)
        if verdict.w_scatter() is not None:
            break
    assert verdict is not None
    if ba_path.is_file():  # the whole memory plan: two live values on the same bytes, async windows
        verdict.memory_plan = memory_plan(hlo)
    else:  # the harness's compile keeps the buffer assignment: without it the question stays open
        verdict.memory_plan = {"error": "the compile kept no buffer assignment"}
    return verdict


def record_rules(record: dict) -> str:
    """The alias rules of the compiler that made ``record``: the target's, or for the host its device's."""
    from xla_harness.stress.compile_only.run import host_rules

    if record.get("target") != "host":
        return str(record.get("scan", {}).get("backend", "auto"))
    return host_rules(str(record.get("device_kind", "")))


def record_summary(record: dict) -> dict:
    return {k: record.get(k) for k in ("label", "target", "versions", "device_kind", "devices", "compile_cpu_s",
                                       "fingerprint", "target_leaf", "hlo")}
