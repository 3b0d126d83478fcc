"""Workaround variants for the tied-embedding hazard (jax-ml/jax#35409), as small swaps.

A model that ties W[V, D] uses it twice: a token lookup (``W[tokens]``, a gather whose gradient is
a scatter-add into W's gradient) and the output logits (``h @ W.T``, whose gradient is a dense
dot). A variant changes how those two uses are written and nothing else; every variant computes
the same function and the same gradient, so its loss trajectory matches the baseline.

**API**: a model gets a :class:`TiedOps` from :func:`tied_ops` and writes ::

    w_lookup, w_out = ops.split(W)                          # the fan-out of W into its two uses
    x = ops.lookup(w_lookup, tokens, out_sharding=None)     # [B, T] int -> [B, T, D]
    logits = ops.unembed(h, w_out, out_sharding=None)       # [B, T, D] -> [B, T, V]

A mode's ``stop_gradient`` goes on ``w_lookup``/``w_out`` after ``split``; ``out_sharding`` is for
meshes with explicit axes (None otherwise). The defaults (``baseline``) are ``(W, W)``,
``jnp.take(W, tokens, axis=0)`` and ``einsum("...d,vd->...v", h, W)``. The #35409 preset
(:mod:`xla_harness.programs.issue_35409`, ``make(variant=...)``) is written this way, and so is the
built-in tied-embedding model (``program(variant=...)``; its ``baseline`` is the model as written,
compiled as before). A model whose tied uses live in a library layer
(a Flax ``nnx.Embed``) needs the same change in its own code: ``examples/flax_tied`` shows it.

Variants, and what each changes in the compiled step, as measured on CPU (jax 0.12.0.1, preset at
``scale=1/64, seq_scale=1/8, layers=(1, 2)``, W f32[1568, 32]; counted by
:func:`xla_harness.hlo.tied.tied_summary`, asserted in ``tests/test_variants.py``):

``baseline``  2 gathers from W, 6 W-shaped dots, 1 scatter-add into W's shape whose in-place
              buffer is the dense gradient (the two batches' dot gradients added): XLA merged the
              two paths by scattering onto the dense gradient.
``barrier``   ``jax.lax.optimization_barrier`` on W before the lookup. Its transpose puts a barrier
              on the lookup's cotangent: 2 scatter-adds (one per batch), each into a fresh buffer of
              zeros, added to the dense gradient afterwards; no scatter updates the dense buffer.
              Gathers and dots unchanged.
``onehot``    the lookup as ``one_hot(tokens, V) @ W``: no gather from W and no scatter into W's
              shape at all; 10 W-shaped dots instead of 6 (costs a [B*T, V] one-hot matrix).
``sumgrad``   a ``jax.custom_vjp`` fan-out ``W -> (W, W)`` whose backward pass sums the two
              cotangents explicitly after an optimization barrier on both: same HLO shape as
              ``barrier`` (2 scatter-adds into zeros, the sum afterwards).

On a 2-D (2, 4) mesh with explicit axes (8 host devices) the same holds per shard: ``baseline``
scatters onto the all-reduced, sliced dense gradient of W's [V/2, D/4] shard, ``barrier`` onto
zeros. On CPU no scatter fusion's in-place operand is a transpose in any variant (CPU never fuses
a producer into a scatter); that the variants remove the reported TPU fusion (scatter whose
in-place operand is ``transpose(parameter)``) is not verified here: no TPU.

Every variant computes the same function and gradient: over 10 AdamW steps (lr 1e-3, the size
above) the losses match the baseline within 6.1e-8 relative and W within 4.3e-7 absolute (the flag
set; the program variants within 1.4e-7). The tests allow 1e-5 for both; cutting one gradient path
(``sparse_only``) moves W by 1.4e-2 and the loss by 2.5e-3 relative.

Compiler-flag sets (:data:`FLAG_SETS`) are variants of the compile, not of the program; each names
the environment variable it belongs to (``XLA_FLAGS``: libtpu reads its DebugOptions there too, and
refuses them in ``LIBTPU_INIT_ARGS``) and is applied per compile through jit's ``compiler_options``
(:func:`with_flag_set`), so several sets
compile in one process. Flag names come from XLA's ``xla/debug_options_flags.cc``, pass names from
the pass's ``name()``.

``xla-no-fusion``  ``--xla_disable_hlo_passes=fusion``: on CPU the multi-op loop fusions go from 225
                   to 0 (instructions 3342 -> 4051), but the W scatter still updates the dense
                   gradient in place: that merge is not a fusion decision. Loss trajectory as above.
``tpu-no-fusion``  ``--xla_disable_hlo_passes=tpu_fusion,tpu_multi_output_fusion`` in ``XLA_FLAGS``:
                   libtpu's fusion passes, named in its own pass dump; on a small tied step compiled
                   for v6e ahead of time the fusions go down (tests/test_targets.py). Not run on a
                   TPU here.
``deterministic``  ``--xla_gpu_deterministic_ops=true`` (XLA's GPU compiler only; refused for cpu and
                   tpu, with the reason). Every scatter XLA cannot prove deterministic (indices not
                   marked unique, a float combiner) becomes a sort of the indices, a prefix scan that
                   adds the updates of equal indices, and a scatter with ``indices_are_sorted=true,
                   unique_indices=true``, which the GPU scatter emitter writes with plain stores
                   instead of atomic read-modify-writes. Ahead of time (``cuda:`` targets) the compile
                   needs ``--xla_gpu_enable_triton_gemm=false`` too (the gemm autotuner has no device:
                   "Failed to get configs for: 6 out of 6 instructions" on the quickstart program),
                   so the variant carries it there and its record's flags say so; on a GPU it is the
                   deterministic flag alone. Quickstart program for cuda:h200, jax 0.12.0.1: 321 ->
                   631 instructions, 2 scatters with atomics -> 2 sorts and 2 scatters of unique
                   indices (tests/test_variants_deterministic.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from xla_harness.errors import HarnessError


def take_lookup(w, tokens, out_sharding=None):
    """Baseline lookup: a gather (its gradient is a scatter-add)."""
    import jax.numpy as jnp

    if out_sharding is None:
        return jnp.take(w, tokens, axis=0)
    return w.at[tokens].get(out_sharding=out_sharding)


def dot_unembed(h, w, out_sharding=None):
    """Baseline output projection ``h @ W.T`` (its gradient is a dense dot)."""
    import jax.numpy as jnp

    return jnp.einsum("...d,vd->...v", h, w, out_sharding=out_sharding)


def identity_split(w):
    return w, w


def barrier_split(w):
    """An optimization barrier on W before the lookup: the lookup's cotangent passes a barrier."""
    import jax

    return jax.lax.optimization_barrier(w), w


def onehot_lookup(w, tokens, out_sharding=None):
    """The lookup as a matmul with a one-hot matrix: no gather, no scatter."""
    import jax
    import jax.numpy as jnp

    onehot = jax.nn.one_hot(tokens, w.shape[0], dtype=w.dtype)
    return jnp.einsum("...v,vd->...d", onehot, w, out_sharding=out_sharding)


@functools.cache
def _sumgrad_split_fn():
    import jax

    @jax.custom_vjp
    def split(w):
        return w, w

    def fwd(w):
        return (w, w), None

    def bwd(_, cotangents):
        g_lookup, g_out = jax.lax.optimization_barrier(cotangents)
        return (g_lookup + g_out,)

    split.defvjp(fwd, bwd)
    return split


def sumgrad_split(w):
    """Fan-out ``W -> (W, W)`` with a custom VJP that sums both cotangents explicitly."""
    return _sumgrad_split_fn()(w)


@dataclass(frozen=True)
class TiedOps:
    """The two uses of a tied matrix and the fan-out between them (see the module docstring)."""

    name: str
    split: Callable = identity_split
    lookup: Callable = take_lookup
    unembed: Callable = dot_unembed
    doc: str = ""


VARIANTS: dict[str, TiedOps] = {
    "baseline": TiedOps("baseline", doc="the model as written"),
    "barrier": TiedOps("barrier", split=barrier_split,
                       doc="optimization_barrier on W before the lookup"),
    "onehot": TiedOps("onehot", lookup=onehot_lookup, doc="one-hot matmul lookup: no gather, no scatter"),
    "sumgrad": TiedOps("sumgrad", split=sumgrad_split,
                       doc="custom_vjp fan-out summing the two gradient paths explicitly"),
}


def tied_ops(name: str = "baseline") -> TiedOps:
    """The program variant called ``name`` (one of :data:`VARIANTS`)."""
    if name not in VARIANTS:
        raise HarnessError(f"unknown variant {name!r}; expected one of {', '.join(VARIANTS)}"
                           + (" (flag sets apply to the compile: use flag_set())" if name in FLAG_SETS else ""))
    return VARIANTS[name]


# ----------------------------------------------------------------------------- flag sets


FlagValue = str | bool | int


@dataclass(frozen=True)
class FlagSet:
    """Named compiler flags: for the environment variable ``env`` and as jit ``compiler_options``.
    ``aot_flags`` are added when the compile is ahead of time (no device: what it needs to compile
    there at all); ``refused`` says why a backend outside ``backends`` cannot take the set."""

    name: str
    env: str  # "XLA_FLAGS" or "LIBTPU_INIT_ARGS"
    flags: dict[str, FlagValue] = field(default_factory=dict)
    backends: tuple[str, ...] = ("cpu",)
    doc: str = ""
    aot_flags: dict[str, FlagValue] = field(default_factory=dict)
    refused: str = ""

    def all_flags(self, ahead_of_time: bool = False) -> dict[str, FlagValue]:
        return {**self.flags, **(self.aot_flags if ahead_of_time else {})}

    def env_text(self, ahead_of_time: bool = False) -> str:
        """The flags as they go into ``env`` (``--name=value`` separated by spaces; booleans as XLA spells
        them, true/false)."""
        def text(v: FlagValue) -> str:
            return str(v).lower() if isinstance(v, bool) else str(v)

        return " ".join(f"--{k}={text(v)}" for k, v in self.all_flags(ahead_of_time).items())

    def compiler_options(self, ahead_of_time: bool = False) -> dict[str, FlagValue]:
        """As jit's ``compiler_options`` (a boolean flag must be a Python bool there)."""
        return self.all_flags(ahead_of_time)


FLAG_SETS: dict[str, FlagSet] = {
    # InstructionFusion::name() is "fusion" (xla/service/instruction_fusion.h); the CPU fusion pass
    # inherits it. Disabling it removes every producer/consumer fusion, the offending one included.
    "xla-no-fusion": FlagSet(
        "xla-no-fusion", "XLA_FLAGS", {"xla_disable_hlo_passes": "fusion"}, ("cpu",),
        doc="disable the instruction-fusion pass (CPU: measured; GPU fuses in passes of other names)"),
    # libtpu's fusion passes are "tpu_fusion" and "tpu_multi_output_fusion" (its pass dump names each
    # pass: ...before_tpu_fusion.txt; a pass bisection on v6e finds this pair removes every multi-op
    # fusion of a small program). libtpu reads DebugOptions from XLA_FLAGS and from jit's
    # compiler_options; LIBTPU_INIT_ARGS refuses --xla_disable_hlo_passes ("Unknown command line
    # flag"). Checked by an ahead-of-time compile for v6e (tests/test_targets.py): fusions go down.
    "tpu-no-fusion": FlagSet(
        "tpu-no-fusion", "XLA_FLAGS", {"xla_disable_hlo_passes": "tpu_fusion,tpu_multi_output_fusion"},
        ("tpu",), doc="disable libtpu's fusion passes; measured by an ahead-of-time v6e compile"),
    # XLA's GPU compiler: --xla_gpu_deterministic_ops "Guarantees run-to-run determinism on GPU"
    # (debug_options_flags.cc). With it, RequireDeterminism() holds and gpu_compiler.cc rewrites every
    # scatter XLA cannot prove deterministic (ScatterExpander kEliminateIndeterministicScatters; first
    # the ScatterDeterminismExpander, on by default: sort the indices, add the updates of equal indices
    # with a prefix scan, then scatter with indices_are_sorted=true, unique_indices=true, which the
    # scatter emitter writes with plain stores instead of atomic read-modify-writes); the autotuners
    # pick deterministic algorithms. Ahead of time the gemm autotuner has no device to pick with:
    # "INTERNAL: Failed to get configs for: N out of N instructions" (also with
    # --xla_gpu_autotune_level=0), unless Triton gemm fusions are off, so the ahead-of-time compile
    # carries --xla_gpu_enable_triton_gemm=false (tests/test_variants_deterministic.py).
    "deterministic": FlagSet(
        "deterministic", "XLA_FLAGS", {"xla_gpu_deterministic_ops": True}, ("gpu",),
        aot_flags={"xla_gpu_enable_triton_gemm": False},
        refused="XLA's deterministic-ops flag (--xla_gpu_deterministic_ops) belongs to its GPU compiler; the "
                "CPU compiler and libtpu have no such flag (they would accept it and change nothing)",
        doc="XLA's GPU deterministic-ops flag: scatters without unique indices become sort + prefix scan + a "
            "scatter of unique indices (no atomics); ahead of time with Triton gemm fusions off, which the "
            "compile needs there (the record's flags say so)"),
}


def flag_set(name: str) -> FlagSet:
    if name not in FLAG_SETS:
        raise HarnessError(f"unknown flag set {name!r}; expected one of {', '.join(FLAG_SETS)}")
    return FLAG_SETS[name]


def check_flag_set(name: str, backend: str) -> FlagSet:
    """The flag set ``name`` if it is meant for ``backend`` (cpu, gpu or tpu); HarnessError saying why
    not otherwise."""
    fs = flag_set(name)
    if backend not in fs.backends:
        why = f": {fs.refused}" if fs.refused else ""
        raise HarnessError(f"flag set {name} ({fs.env}) is for {', '.join(fs.backends)}, "
                           f"but the step compiles for {backend}{why}")
    return fs


def check_variants(names, backend: str) -> None:
    """Every flag set named in ``names`` (variant names) is meant for ``backend``: checked before the
    first configuration compiles, so a matrix is refused whole, not after its baseline."""
    for name in names:
        _, _, flags = parse_variant(name)
        if flags:
            check_flag_set(flags, backend)


def with_flag_set(program, name: str, backend: str | None = None, ahead_of_time: bool = False):
    """``program`` compiled with flag set ``name`` (its jit_kwargs gain ``compiler_options``); the
    set must be meant for ``backend`` (the compile target's: cpu, gpu or tpu; default the backend jax
    runs on). ``ahead_of_time``: the compile has no device (a tpu:/cuda: target), and the set's
    ``aot_flags`` are added; the program's options record every flag given."""
    from dataclasses import replace

    if backend is None:
        import jax

        backend = jax.default_backend()
    fs = check_flag_set(name, backend)
    options = {**program.jit_kwargs.get("compiler_options", {}), **fs.compiler_options(ahead_of_time)}
    return replace(program, name=f"{program.name}+{name}", jit_kwargs={**program.jit_kwargs,
                                                                         "compiler_options": options},
                   options={**program.options, "flag_set": name, fs.env: fs.env_text(ahead_of_time)})


# ----------------------------------------------------------------------------- matmul precision

# Variants of the dots' matmul precision: the program built with ``precision=`` (the built-ins take it;
# see xla_harness.programs.precision). ``default`` is the baseline.
PRECISION_VARIANTS: dict[str, str] = {"precision-high": "high", "precision-highest": "highest"}


def _unknown_part(name: str, part: str) -> str:
    """The error for a part of a variant name that names nothing: every name it could be, and a
    near miss (another case, ``precision-default``) said."""
    hint = ""
    lower = part.lower()
    if lower != part and lower in {*VARIANTS, *PRECISION_VARIANTS, *FLAG_SETS}:
        hint = f" (names are lower case: {lower})"
    elif lower == "precision-default":
        hint = " (the default precision is the baseline's: leave the part out)"
    what = f"variant {name!r}: unknown part {part!r}" if part != name else f"unknown variant {name!r}"
    return (f"{what}{hint}; a variant is [PROGRAM_VARIANT][+precision-P][+FLAG_SET], program variants: "
            f"{', '.join(VARIANTS)}; precision: {', '.join(PRECISION_VARIANTS)}; flag sets: {', '.join(FLAG_SETS)}")


def parse_variant(name: str) -> tuple[str, str, str]:
    """``(program variant, matmul precision, flag set or '')`` of a variant name, written
    ``[PROGRAM_VARIANT][+precision-P][+FLAG_SET]`` in that order: ``barrier``, ``xla-no-fusion`` (the
    baseline under that flag set), ``precision-highest`` (the baseline with its dots at ``highest``),
    ``barrier+xla-no-fusion``, ``onehot+precision-high+tpu-no-fusion``. HarnessError for an unknown
    part or parts out of that order."""
    parts = name.split("+")
    head, precision, flags = "baseline", "default", ""
    kinds = []
    for part in parts:
        if part in PRECISION_VARIANTS:
            kinds.append(1)
            precision = PRECISION_VARIANTS[part]
        elif part in FLAG_SETS:
            kinds.append(2)
            flags = part
        elif part in VARIANTS:
            kinds.append(0)
            head = part
        else:
            raise HarnessError(_unknown_part(name, part))
    if kinds != sorted(set(kinds)):
        raise HarnessError(f"variant {name!r}: write it as PROGRAM_VARIANT+precision-P+FLAG_SET (each part at most "
                           f"once, in that order; precision: {', '.join(PRECISION_VARIANTS)}; flag sets: "
                           f"{', '.join(FLAG_SETS)})")
    return head, precision, flags


def variant_program(make, name: str, backend: str | None = None, ahead_of_time: bool = False, **options):
    """The program ``make(**options)`` under variant ``name``: a program variant (``make`` must take
    ``variant=``), a matmul precision (``make`` must take ``precision=``), a flag set, or a
    combination (e.g. ``barrier+xla-no-fusion``, ``precision-highest+tpu-no-fusion``). This is what
    each name of a ``stress --variants`` list becomes, one compile per name."""
    head, precision, flags = parse_variant(name)
    extra: dict = {}
    if head != "baseline":
        extra["variant"] = head
    if precision != "default":
        if "precision" in options:
            raise HarnessError(f"variant {name!r} sets the precision, and so does the option "
                               f"precision={options['precision']!r}: give one of them")
        extra["precision"] = precision
    try:
        program = make(**options, **extra)
    except TypeError as e:
        takes = " and ".join({"variant": "program variants", "precision": "precision="}[k] for k in extra) \
            or "these options"
        raise HarnessError(f"variant {name!r}: this program does not take {takes} ({e})") from e
    return with_flag_set(program, flags, backend, ahead_of_time) if flags else program
