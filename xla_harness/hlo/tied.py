"""Where a tied matrix W[V, D] shows up in compiled HLO: its lookup, its dots, its gradient's scatter.

The tied-embedding pattern of jax-ml/jax#35409 in a compiled training step is

* a **gather** reading W (the token lookup),
* **dots** reading W or transpose(W) or producing a W-shaped value (the output logits, the
  logits' gradient with respect to W), and
* a **scatter** producing a W-shaped value (the lookup's gradient, a scatter-add). When XLA merges
  the two gradient paths, that scatter updates the dense (dot) gradient in place; on TPU the
  reported fusion's in-place operand is ``transpose(parameter)``.

:func:`tied_summary` finds these by shape (W's dims, either order) and, for every W-shaped scatter,
follows its in-place operand (operand 0) back: inside its fusion to a fusion parameter (noting any
transpose on the way), then in the calling computation to where that buffer comes from:
``dense`` (a dot or a fusion holding one, through adds/copies/bitcasts/loop fusions and, on a
mesh, the all-reduce and dynamic-slice that bring the dense gradient to W's shard),
``broadcast`` (a fresh buffer of zeros), ``barrier`` (an optimization barrier's output),
``parameter`` or ``other``. Pure functions over :class:`xla_harness.hlo.ir.HloModule`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from xla_harness.hlo.ir import Computation, HloModule, Instruction
from xla_harness.hlo.scan import contains_dense

_WALK_IN_FUSION = ("bitcast", "copy", "transpose", "reshape", "convert")
# Data-flow steps between a dot and the scatter's buffer: elementwise sums and moves, and on a mesh
# the collectives and slices that bring the dense gradient to W's shard.
_WALK_IN_CALLER = ("add", "copy", "bitcast", "transpose", "reshape", "convert", "fusion", "get-tuple-element",
                   "all-reduce", "all-reduce-done", "all-reduce-start", "reduce-scatter", "dynamic-slice", "tuple")


@dataclass(frozen=True)
class ScatterSite:
    scatter: str
    computation: str
    fusion: str  # the fusion instruction calling ``computation`` ("" when the scatter is not fused)
    in_place_source: str  # dense | broadcast | barrier | parameter | other
    via_transpose: bool  # the in-place operand reaches the fusion parameter through a transpose


@dataclass(frozen=True)
class TiedSummary:
    w_dims: tuple[int, int]
    gathers: int
    dots: int  # dots reading or producing a W-shaped value
    scatters: tuple[ScatterSite, ...]
    dots_reading: int = 0  # of those, dots with W-shaped operand (W or transpose(W) itself)

    @property
    def scatter_onto_dense(self) -> int:
        """W-shaped scatters updating the dense gradient's buffer in place."""
        return sum(s.in_place_source == "dense" for s in self.scatters)

    @property
    def scatter_via_transpose(self) -> int:
        """W-shaped scatter fusions whose in-place operand is a transpose of a fusion parameter."""
        return sum(s.via_transpose for s in self.scatters)

    def to_json(self) -> dict:
        return {"w_dims": list(self.w_dims), "gathers": self.gathers, "dots": self.dots,
                "dots_reading": self.dots_reading,
                "scatters": [asdict(s) for s in self.scatters],
                "scatter_onto_dense": self.scatter_onto_dense,
                "scatter_via_transpose": self.scatter_via_transpose}


def _is_w(ins: Instruction, w_dims: tuple[int, int]) -> bool:
    return not ins.shape.is_tuple and sorted(ins.shape.dims) == sorted(w_dims)


def _is_float(ins: Instruction) -> bool:
    return any(s.element_type.startswith(("f", "bf")) for _, s in ins.shape.leaves())


def _callers(module: HloModule) -> dict[str, tuple[Computation, Instruction]]:
    out: dict[str, tuple[Computation, Instruction]] = {}
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode == "fusion" and ins.called:
                out[ins.called[0]] = (comp, ins)
    return out


def _fused_root_opcode(module: HloModule, ins: Instruction) -> str:
    comp = module.by_name.get(ins.called[0]) if ins.called else None
    if comp is None:
        return ""
    root = comp.root
    while root.opcode in _WALK_IN_FUSION and root.operands:
        root = comp.operand(root.operands[0])[0]
    return root.opcode


def source_kind(module: HloModule, comp: Computation, ref: str, w_dims: tuple[int, int], depth: int = 0) -> str:
    """Where the W-shaped buffer ``ref`` in ``comp`` comes from (see the module docstring)."""
    ins = comp.operand(ref)[0]
    if contains_dense(module, ins):
        return "dense"
    if ins.opcode == "broadcast" or (ins.opcode == "fusion" and _fused_root_opcode(module, ins) == "broadcast"):
        return "broadcast"
    if ins.opcode == "opt-barrier" or (ins.opcode == "get-tuple-element"
                                       and comp.operand(ins.operands[0])[0].opcode == "opt-barrier"):
        return "barrier"
    if ins.opcode == "parameter":
        return "parameter"
    if ins.opcode in _WALK_IN_CALLER and depth < 12:
        kinds = [source_kind(module, comp, op, w_dims, depth + 1) for op in ins.operands
                 if _is_float(comp.operand(op)[0])]
        for kind in ("dense", "barrier", "broadcast", "parameter"):
            if kind in kinds:
                return kind
    return "other"


def _scatter_site(module: HloModule, comp: Computation, scatter: Instruction, w_dims: tuple[int, int],
                  callers: dict[str, tuple[Computation, Instruction]]) -> ScatterSite:
    ins = comp.operand(scatter.operands[0])[0]
    via_transpose = False
    while ins.opcode in _WALK_IN_FUSION and ins.operands:
        via_transpose |= ins.opcode == "transpose"
        ins = comp.operand(ins.operands[0])[0]
    if comp.name in callers and ins.opcode == "parameter":
        caller, fusion = callers[comp.name]
        kind = source_kind(module, caller, fusion.operands[ins.parameter_number], w_dims)
        return ScatterSite(scatter.name, comp.name, fusion.name, kind, via_transpose)
    kind = source_kind(module, comp, scatter.operands[0], w_dims)
    return ScatterSite(scatter.name, comp.name, "", kind, via_transpose and comp.name in callers)


def tied_summary(module: HloModule, w_dims: tuple[int, int]) -> TiedSummary:
    """Gathers from W, dots reading or producing W's shape (either orientation) and W-shaped scatters."""
    callers = _callers(module)
    gathers = dots = dots_reading = 0
    scatters: list[ScatterSite] = []
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode == "gather" and _is_w(comp.operand(ins.operands[0])[0], w_dims):
                gathers += 1
            elif ins.opcode == "dot":
                reads = any(_is_w(comp.operand(op)[0], w_dims) for op in ins.operands)
                dots += reads or _is_w(ins, w_dims)
                dots_reading += reads
            elif ins.opcode == "scatter" and _is_w(ins, w_dims):
                scatters.append(_scatter_site(module, comp, ins, w_dims, callers))
    rows, cols = w_dims  # any pair (a list, Shape.dims) is stored as the tuple[int, int] the field says
    return TiedSummary((rows, cols), gathers, dots, tuple(scatters), dots_reading)


# ----------------------------------------------------------------------------- what a compiler aliased


@dataclass(frozen=True)
class AliasedScatterWrite:
    """A fusion the compiler aliased (libtpu's ``backend_config``) that holds a W-shaped scatter, and
    where its in-place buffer comes from in the computation that calls it."""

    fusion: str
    operand: int
    producer: str  # the instruction producing the aliased operand (through get-tuple-elements)
    source: str  # dense | dense-via | select-broadcast | broadcast | data-moving | parameter | other
    via_tuple: bool  # read through a get-tuple-element of a multi-output producer
    text: str  # the source in words, as results/tpu-aot/README.md writes it


_DATA_MOVING = ("transpose", "copy", "reshape")


def _holds_w_scatter(module: HloModule, ins: Instruction, w_dims: tuple[int, int], depth: int = 0) -> bool:
    comp = module.by_name.get(ins.called[0]) if ins.called else None
    if comp is None or depth > 4:
        return False
    return any((i.opcode == "scatter" and _is_w(i, w_dims))
               or (i.opcode == "fusion" and _holds_w_scatter(module, i, w_dims, depth + 1))
               for i in comp.instructions)


def _broadcast_of_zero(comp: Computation, ins: Instruction) -> bool:
    if ins.opcode != "broadcast" or not ins.operands:
        return False
    src = comp.operand(ins.operands[0])[0]
    return src.opcode == "constant" and src.literal.strip().strip("{}").strip() in ("0", "-0", "0.0", "false")


def _root(module: HloModule, ins: Instruction) -> tuple[Computation, Instruction] | None:
    comp = module.by_name.get(ins.called[0]) if ins.called else None
    return (comp, comp.root) if comp is not None else None


def _classify(module: HloModule, comp: Computation, ins: Instruction) -> tuple[str, str]:
    """(source kind, words) of the instruction producing a scatter fusion's in-place buffer."""
    if contains_dense(module, ins):
        return "dense", "the dense (dot) gradient's fusion" if ins.opcode == "fusion" else "a dot"
    if _broadcast_of_zero(comp, ins):
        return "broadcast", "a broadcast zero"
    if ins.opcode in _DATA_MOVING:
        return "data-moving", f"a {ins.opcode} (moves data)"
    if ins.opcode == "parameter":
        return "parameter", "an entry parameter"
    if ins.opcode == "fusion" and (found := _root(module, ins)) is not None:
        fcomp, root = found
        kind = ins.fusion_kind or "fusion"
        if root.opcode == "select" and any(_broadcast_of_zero(fcomp, fcomp.operand(op)[0])
                                           for op in root.operands[1:]):
            return "select-broadcast", f"a select of a broadcast zero ({kind})"
        if _broadcast_of_zero(fcomp, root):
            return "broadcast", f"a fused broadcast zero ({kind})"
        if root.opcode in _DATA_MOVING:
            return "data-moving", f"a {root.opcode} fusion ({kind}, moves data)"
        path = _path_to_dense(module, comp, ins)
        if path is not None:
            after = f" after {', '.join(sorted(path))}" if path else ""
            return "dense-via", f"the dense (dot) gradient, via a {kind} fusion (root {root.opcode}){after}"
        return "other", f"a {root.opcode} fusion ({kind})"
    return "other", f"a {ins.opcode}"


# Ops through which W's dense gradient reaches W's shard: moves between buffers and devices (not
# named in the path), and the sums, conversions, slices and concatenations around them (named).
_SILENT = ("get-tuple-element", "bitcast", "copy-start", "copy-done")
_ON_THE_WAY = ("collective-permute", "collective-permute-start", "collective-permute-done", "all-reduce",
               "all-reduce-start", "all-reduce-done", "all-gather", "all-gather-start", "all-gather-done",
               "reduce-scatter", "concatenate", "slice", "dynamic-slice", "pad", "add", "convert", "copy", "fusion")


def _path_to_dense(module: HloModule, comp: Computation, ins: Instruction, depth: int = 0,
                   seen: dict[str, set[str] | None] | None = None) -> set[str] | None:
    """The ops between ``ins``'s inputs and a dot (or a fusion holding one) when its float inputs
    come from one through :data:`_ON_THE_WAY` ops within a few steps; None when none does. A fusion
    on the way is named by its root (``dynamic-slice fusion``), a collective by its name."""
    seen = {} if seen is None else seen
    if ins.name in seen:
        return seen[ins.name]
    seen[ins.name] = None  # a cycle or a repeat within this walk adds nothing
    if depth > 8:
        return None
    found: set[str] | None = None
    for ref in ins.operands:
        src = comp.operand(ref)[0]
        if not _is_float(src):
            continue
        if contains_dense(module, src):
            found = found or set()
            continue
        if src.opcode not in _SILENT + _ON_THE_WAY:
            continue
        rest = _path_to_dense(module, comp, src, depth + 1, seen)
        if rest is None:
            continue
        name = "" if src.opcode in _SILENT else src.opcode.removesuffix("-start").removesuffix("-done")
        if src.opcode == "fusion":
            root = _root(module, src)
            name = f"{root[1].opcode} fusion" if root else "fusion"
        found = (found or set()) | rest | ({name} if name else set())
    seen[ins.name] = found
    return found


def aliased_scatter_writes(module: HloModule, w_dims: tuple[int, int]) -> list[AliasedScatterWrite]:
    """Every fusion the compiler aliased (an ``aliasing_operands`` pair in its backend_config) that
    holds a scatter of W's shape (``w_dims``, either order; nested fusions followed), with where each
    aliased operand comes from in the calling computation: followed back through get-tuple-elements
    and bitcasts to its producer, then classified (a fusion holding a dot: W's dense gradient; a
    broadcast of zero; a fusion whose root selects a broadcast zero; a fusion whose inputs come from
    a dot through collectives, sums, slices and concatenations, named with them: the dense gradient
    brought to W's shard; a data-moving op; ...).
    Empty for a module whose compiler writes no aliasing (CPU, GPU)."""
    from xla_harness.hlo.compiler_alias import instruction_pairs

    out = []
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode != "fusion" or not _holds_w_scatter(module, ins, w_dims):
                continue
            for operand, _ in instruction_pairs(ins) or ():
                src = comp.operand(ins.operands[operand])[0]
                via_tuple = False
                while src.opcode in ("get-tuple-element", "bitcast") and src.operands:
                    via_tuple |= src.opcode == "get-tuple-element"
                    src = comp.operand(src.operands[0])[0]
                kind, words = _classify(module, comp, src)
                out.append(AliasedScatterWrite(ins.name, operand, src.name, kind, via_tuple,
                                               words + (" (via a get-tuple-element)" if via_tuple else "")))
    return out
