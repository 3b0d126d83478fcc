"""xla-harness gradcheck: differential gradient checks for the known NaN bug classes."""

from __future__ import annotations

NAME = "gradcheck"
HELP = "check gradients of where-guards, select JVPs, loops and determinism against oracles"
DESCRIPTION = """\
Run the gradient case registry in modes eager, jit, vjp and jvp (while_loop cases: jvp
only) and compare with the analytic answer, central finite differences in float64, and
the J^T consistency <u, J v> == <J^T u, v>. Loop cases also check second order.
Prints a table case x mode -> OK / NaN / WRONG / NONDET (or --json).

--framework jax,tf,mlx runs the same registry in every framework named: columns framework x
mode (jax eager/jit/vjp/jvp; tf eager/graph/jit_compile, plus jit_patched when
XLA_HARNESS_TF_OPLIB names the op library with the patched tf2xla lowerings; mlx
eager/compile/vjp/jvp), cells OK / NaN / WRONG against the analytic answer and float64
finite differences (from jax), n/a where a framework lacks an op, and a column naming the
frameworks whose modes disagree. A framework that does not import gets one column
"not installed".

--masking turns on jax_zero_cotangent_masking (a jax built with patches/jax/0001; stock jax
has no such flag). Exit 1 when any check is NaN or WRONG, 0 otherwise; NONDET (e.g.
scatter-add with duplicate indices on GPU) is reported, not failed.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("--cases", help="comma-separated case names or prefixes (default: all)")
    p.add_argument("--modes", default="eager,jit,vjp,jvp", help="comma-separated modes (jax alone)")
    p.add_argument("--masking", action="store_true", help="enable jax_zero_cotangent_masking")
    p.add_argument("--framework", default="jax",
                   help="comma-separated frameworks: jax, tf, mlx (more than jax: the cross-framework table)")
    flags.add_json_argument(p, "the verdicts")
    p.add_argument("--list", action="store_true", help="list the cases and exit")


def _list(text: str, flag: str) -> list[str]:
    """A comma-separated flag value: at least one item, none twice."""
    from xla_harness.errors import HarnessError

    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise HarnessError(f"--{flag} lists nothing")
    for i, t in enumerate(items):
        if t in items[:i]:
            raise HarnessError(f"--{flag} lists {t!r} twice")
    return items


def run(args) -> int:
    from xla_harness.targets import HOST
    from xla_harness.targets.envcheck import check_compiler_environment

    check_compiler_environment(HOST)  # XLA_FLAGS, JAX_PLATFORMS: before jax starts
    import jax

    from xla_harness.errors import HarnessError
    from xla_harness.gradcheck import check, cross
    from xla_harness.gradcheck.cases import REGISTRY

    if args.list:
        for c in REGISTRY:
            print(f"{c.name:<36} {c.kind:<12} {c.note}")
        return 0
    if args.masking:
        try:
            jax.config.update("jax_zero_cotangent_masking", True)
        except (AttributeError, KeyError, ValueError):
            raise HarnessError("this jax has no jax_zero_cotangent_masking flag (stock jax); use "
                               ".venv-jax-patched from 'make patches-jax-check'") from None
    names = _list(args.cases, "cases") if args.cases is not None else None
    frameworks = cross.parse_frameworks(args.framework)
    if frameworks != ["jax"]:
        result = cross.run(check.select(names), frameworks)
        print(cross.to_json(result) if args.json else cross.table(result))
        return 1 if cross.failing(result) else 0
    modes = tuple(_list(args.modes, "modes"))
    verdicts = check.run(names, modes)
    print(check.to_json(verdicts) if args.json else check.table(verdicts))
    return 1 if any(v.status in ("NaN", "WRONG") for v in verdicts) else 0
