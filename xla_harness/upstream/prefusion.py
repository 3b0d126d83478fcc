"""Dump pre-fusion HLO modules of a set of JAX programs, for measuring how many fusion decisions a
patch to the fusion pass changes (``python -m xla_harness.upstream.xlatest blast-radius``).

    python -m xla_harness.upstream.prefusion --out DIR [--target host|tpu:GEN:SHAPE|cuda:KIND[:TOPO]]
                                             [--program NAME ...]

Each program is jitted and compiled for the target with ``--xla_dump_hlo_pass_re`` set to that
target's fusion pass (:data:`FUSION_PASSES`); XLA then writes ``*.before_<pass>.txt``: the module as
the compiler hands it to its fusion pass (after layout assignment and simplification). ``host``
(the default) compiles on the CPU; ``tpu:...`` with libtpu and ``cuda:...`` with the CUDA plugin,
ahead of time on this machine (:mod:`xla_harness.targets`), each program's arguments placed on the
target's first device. The programs cover the in-place ops that reach the fusion decision: scatter
(embedding gradients, ``.at[].add``, segment sums) and dynamic-update-slice (scan outputs, cache
updates), with and without remat; for a TPU or GPU target also the jax-ml/jax#35409 program at a
small scale (:data:`ISSUE_35409_SCALE`), sharded over all of the target's devices as the preset
shards it. The compiles are in-process: XLA_FLAGS must be set before jax is imported, so run this
module on its own.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xla_harness.errors import HarnessError


@dataclass(frozen=True)
class FusionPass:
    """The fusion pass of a target's compiler, as XLA names it in its dumps."""

    name: str

    @property
    def pass_re(self) -> str:
        """``--xla_dump_hlo_pass_re`` that dumps the module entering this pass (and leaving it)."""
        return f"^{self.name}$"

    @property
    def glob(self) -> str:
        """The dump file of the module entering the pass: XLA names it ``*.after_<previous
        pass>.before_<this pass>.txt``."""
        return f"*.before_{self.name}.txt"


# One place for the pass names: the dump flags of prefusion and the files blast-radius reads.
# CPU: InstructionFusion's CPU subclass "fusion". TPU (libtpu 0.0.50.1): "tpu_fusion", run once in
# the "Main_fusion" pipeline and again in "multi_output_fusion_and_bf16_folding" (each entry is a
# module of its own in the dump). GPU: "priority-fusion" (the CUDA plugin 0.12.0.1).
FUSION_PASSES: dict[str, FusionPass] = {
    "host": FusionPass("fusion"),
    "tpu": FusionPass("tpu_fusion"),
    "cuda": FusionPass("priority-fusion"),
}

# The #35409 preset's scale here: it compiles in seconds (full size takes minutes per compile).
ISSUE_35409_SCALE = 1 / 32


def prefusion_modules(folder: Path) -> list[Path]:
    """Every pre-fusion module under ``folder`` (recursively), of any target's fusion pass."""
    found: set[Path] = set()
    for fusion in FUSION_PASSES.values():
        found.update(Path(folder).rglob(fusion.glob))
    return sorted(found)


def module_patterns() -> str:
    return ", ".join(f.glob for f in FUSION_PASSES.values())


def _programs() -> dict[str, Callable[[], tuple[Callable, tuple]]]:
    import jax
    import jax.numpy as jnp

    from xla_harness.programs import tied_embedding as te

    k = jax.random.PRNGKey(0)
    w = jax.random.normal(k, (256, 64))
    idx = jax.random.randint(k, (32,), 0, 256)
    x = jax.random.normal(k, (8, 64))

    def tied(mode: str, remat: bool):
        cfg = te.ModelConfig(mode=mode, remat=remat)
        params = te.init_params(cfg, k)
        batches = te.make_batches(cfg, k)
        return jax.grad(lambda p, b: te.loss_fn(p, b, cfg)), (params, batches)

    progs: dict[str, Callable[[], tuple[Callable, tuple]]] = {}
    for mode in te.MODES:
        for remat in (True, False):
            progs[f"tied_{mode}_remat{int(remat)}"] = functools.partial(tied, mode, remat)
    progs["embedding_grad"] = lambda: (jax.grad(lambda w: jnp.take(w, idx, axis=0).sum()), (w,))
    progs["transposed_scatter_add"] = lambda: (lambda w, u: w.T.at[idx % 64].add(u), (w, jnp.ones((32, 256))))
    progs["scatter_then_dot"] = lambda: (lambda w, u: (w.T.at[idx % 64].add(u), x @ w.T), (w, jnp.ones((32, 256))))
    progs["segment_sum_grad"] = lambda: (
        jax.grad(lambda v: jax.ops.segment_sum(v * v, idx % 16, 16).sum()), (jnp.ones((32, 8)),))

    def scan_stack(c, xs):
        return jax.lax.scan(lambda c, x: (jnp.tanh(c @ w[:64] + x), c), c, xs)

    progs["scan_stack"] = lambda: (scan_stack, (jnp.ones((8, 64)), jnp.ones((10, 8, 64))))
    progs["scan_stack_grad"] = lambda: (
        jax.grad(lambda c, xs: scan_stack(c, xs)[1].sum()), (jnp.ones((8, 64)), jnp.ones((10, 8, 64))))

    def cache_update(cache, new, pos):
        return jax.lax.dynamic_update_slice(cache, new.T, (0, pos))

    progs["kv_cache_update"] = lambda: (cache_update, (jnp.ones((64, 128)), jnp.ones((4, 64)), 3))

    def mlp_step(params, x, y):
        def loss(p):
            h = jax.nn.relu(x @ p[0])
            return jnp.mean((h @ p[1] - y) ** 2)
        g = jax.grad(loss)(params)
        return [p - 0.1 * gp for p, gp in zip(params, g, strict=True)]

    progs["mlp_step"] = lambda: (mlp_step, ([jnp.ones((64, 128)), jnp.ones((128, 8))], x, jnp.ones((8, 8))))
    progs["sort_gather_grad"] = lambda: (jax.grad(lambda v: jnp.sort(v)[::2].sum() * v[jnp.argsort(v)][0]),
                                         (jnp.arange(64.0),))
    progs["one_hot_xent_grad"] = lambda: (
        jax.grad(lambda w: -(jax.nn.log_softmax(x @ w.T) * jax.nn.one_hot(idx[:8], 256)).sum()), (w,))
    progs["cumsum_topk"] = lambda: (lambda v: (jnp.cumsum(v, axis=0), jax.lax.top_k(v, 4)), (w,))
    progs["conv_grad"] = lambda: (
        jax.grad(lambda k_: jax.lax.conv(jnp.ones((2, 3, 16, 16)), k_, (1, 1), "SAME").sum()),
        (jnp.ones((4, 3, 3, 3)),))
    return progs


ISSUE_35409 = "issue_35409"


def _abstract_on(sharding, args: tuple) -> tuple:
    """``args`` as ``jax.ShapeDtypeStruct``s with ``sharding`` (nothing is transferred): a Python
    scalar stays weakly typed, as jit would trace it."""
    import jax
    import jax.numpy as jnp

    def leaf(a):
        if isinstance(a, bool | int | float):
            return jax.ShapeDtypeStruct((), jnp.result_type(a), sharding=sharding, weak_type=True)
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding, weak_type=getattr(a, "weak_type", False))

    return jax.tree_util.tree_map(leaf, args)


def _compile_issue_35409(target, devices) -> None:
    from xla_harness.programs import issue_35409
    from xla_harness.targets.compile import lower_step

    program = issue_35409.make(scale=ISSUE_35409_SCALE, devices=devices)
    lowered = lower_step(program, target, devices, program_name=ISSUE_35409)
    lowered.compile(compiler_options=dict(program.jit_kwargs.get("compiler_options") or {}))


def dump(out: Path, target=None, only: tuple[str, ...] = ()) -> dict[str, int]:
    """Compile every program (or those named in ``only``) for ``target`` (default the host), XLA_FLAGS
    dumping into ``out``; returns how many pre-fusion modules each program added there. A program
    that added none is refused (HarnessError): its compile did not reach the target's fusion pass (a
    pass renamed in a new compiler, or a compile that went to another backend)."""
    import jax
    from jax.sharding import SingleDeviceSharding

    from xla_harness.targets import HOST
    from xla_harness.targets.devices import target_devices

    target = target or HOST
    fusion = FUSION_PASSES[target.platform]
    progs = _programs()
    known = list(progs) if target.is_host else [*progs, ISSUE_35409]
    unknown = [n for n in only if n not in known]
    if unknown:
        raise HarnessError(f"unknown program {unknown[0]!r} for --target {target.text}; expected one of "
                           f"{', '.join(known)}")
    devices = None if target.is_host else target_devices(target)
    where = "on the CPU" if target.is_host else f"for {target.text}"
    added: dict[str, int] = {}
    for name in (n for n in known if not only or n in only):
        before = set(out.rglob(fusion.glob))
        if name == ISSUE_35409:
            _compile_issue_35409(target, devices)
        elif devices is None:
            fn, args = progs[name]()
            jax.jit(fn).lower(*args).compile()
        else:
            # The outputs are placed too: a program whose result does not read its arguments
            # (conv_grad) would otherwise be compiled for the host, its unused arguments dropped.
            fn, args = progs[name]()
            on = SingleDeviceSharding(devices[0])
            jax.jit(fn, out_shardings=on).lower(*_abstract_on(on, args)).compile()
        added[name] = len(set(out.rglob(fusion.glob)) - before)
        if not added[name]:
            raise HarnessError(f"{name} compiled {where} but dumped no {fusion.glob} module in {out}: the compile "
                               f"did not reach a pass named {fusion.name!r}")
    return added


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xla_harness.upstream.prefusion", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="dump directory")
    ap.add_argument("--target", default="host", help="host (CPU, the default), tpu:GEN:SHAPE (e.g. tpu:v6e:2x4; "
                    "libtpu) or cuda:KIND[:TOPO] (e.g. cuda:h100; the CUDA plugin): whose fusion pass")
    ap.add_argument("--program", action="append", default=[], metavar="NAME",
                    help="dump only this program (repeatable); default: all of the target's programs")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def _main(args: argparse.Namespace) -> int:
    from xla_harness.targets import parse_target
    from xla_harness.targets.devices import compiler_versions, missing, prepare_environment

    target = parse_target(args.target)
    why = missing(target)
    if why:
        raise HarnessError(why)
    if "jax" in sys.modules:
        raise HarnessError("XLA_FLAGS must be set before jax is imported; run this module on its own")
    out = Path(args.out)
    fusion = FUSION_PASSES[target.platform]
    if target.is_host:
        os.environ["JAX_PLATFORMS"] = "cpu"
    prepare_environment(target)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={out} --xla_dump_hlo_as_text"
                               f" --xla_dump_hlo_pass_re={fusion.pass_re}").strip()
    added = dump(out, target, tuple(args.program))
    where = "on the CPU" if target.is_host else f"for {target.text}"
    total = len(list(out.rglob(fusion.glob)))  # with the modules of the eager ops that build the arguments
    print(f"prefusion: {len(added)} programs compiled {where}, {total} pre-fusion modules ({fusion.glob}) in {out}")
    print("prefusion: compiled by " + ", ".join(f"{k} {v}" for k, v in compiler_versions(target).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
