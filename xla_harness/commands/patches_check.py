"""xla-harness patches-check: does the patch series apply to the given source trees?"""

from __future__ import annotations

from pathlib import Path

NAME = "patches-check"
HELP = "git apply --check the patch series against source trees (xla, jax, tensorflow)"
DESCRIPTION = """\
Apply each upstream's patches from patches/series.toml, in order, to a scratch copy of the
files they touch in the given source tree (`git apply --check`, then apply, so the next
patch is checked on top). An upstream without a tree is listed as "not checked: no source
tree given" and never counts as passing.

Exit 0 when every given tree accepts its series, 2 when a patch does not apply (one line
naming the patch, the file and the hunk) or the input is bad.
"""


def add_arguments(p) -> None:
    p.add_argument("--xla-src", type=Path, metavar="DIR", help="XLA source tree")
    p.add_argument("--jax-src", type=Path, metavar="DIR", help="jax source tree (the PyPI sdist by default in make)")
    p.add_argument("--tf-src", type=Path, metavar="DIR", help="TensorFlow source tree")
    p.add_argument("--series", choices=["default", "experimental"], default="default",
                   help="default patches only, or default + experimental (default: default)")
    p.add_argument("--series-file", type=Path, help="series.toml to use (default patches/series.toml)")


def run(args) -> int:
    from xla_harness.upstream.patchcheck import check_upstream
    from xla_harness.upstream.series import load_series

    series = load_series(args.series_file)
    trees = {"xla": args.xla_src, "jax": args.jax_src, "tensorflow": args.tf_src}
    for name, up in series.upstreams.items():
        for r in check_upstream(series, up, trees.get(name), args.series):
            print(r.line())
    return 0
