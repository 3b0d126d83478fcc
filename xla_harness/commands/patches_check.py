"""xla-harness patches-check: does the patch series apply to the given source trees?"""

from __future__ import annotations

import json
from pathlib import Path

NAME = "patches-check"
HELP = "git apply --check the patch series against source trees (xla, jax, tensorflow)"
DESCRIPTION = """\
Apply each upstream's patches from patches/series.toml, in order, to a scratch copy of the
files they touch in the given source tree (`git apply --check`, then apply, so the next
patch is checked on top). Give at least one tree (--xla-src, --jax-src, --tf-src; `make
patches-check` passes the jax sdist from PyPI). An upstream without a tree is listed as "not
checked: no source tree given" and never counts as passing.

Exit 0 when every given tree accepts its series, 2 when no tree is given (nothing would be
checked), when a patch does not apply (one line naming the patch, the file and the hunk), when
a tree was given but no patch could be checked
against it (every patch "not checked": e.g. each touches files the tree lacks), or the input
is bad.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("--xla-src", type=Path, metavar="DIR", help="XLA source tree")
    p.add_argument("--jax-src", type=Path, metavar="DIR", help="jax source tree (the PyPI sdist by default in make)")
    p.add_argument("--tf-src", type=Path, metavar="DIR", help="TensorFlow source tree")
    p.add_argument("--series", choices=["default", "experimental"], default="default",
                   help="default patches only, or default + experimental (default: default)")
    p.add_argument("--series-file", type=Path, help="series.toml to use (default patches/series.toml)")
    flags.add_json_argument(p, "a record per patch (or per upstream not checked), and the error when a patch "
                               "does not apply")


def run(args) -> int:
    from xla_harness.errors import HarnessError
    from xla_harness.upstream.patchcheck import check_upstream, nothing_checked
    from xla_harness.upstream.series import load_series

    series = load_series(args.series_file)
    trees = {"xla": args.xla_src, "jax": args.jax_src, "tensorflow": args.tf_src}
    if all(t is None for t in trees.values()):
        raise HarnessError("patches-check: no source tree given, so nothing would be checked; pass --xla-src, "
                           "--jax-src and/or --tf-src (make patches-check passes the jax sdist)")
    records: list[dict] = []
    unchecked: list[str] = []
    try:
        for name, up in series.upstreams.items():
            results = check_upstream(series, up, trees.get(name), args.series)
            for r in results:
                if args.json:
                    records.append({"upstream": r.upstream, "status": r.status, "detail": r.detail})
                else:
                    print(r.line())
            if (why := nothing_checked(name, trees.get(name), results)) is not None:
                unchecked.append(why)
        if unchecked:
            raise HarnessError("; ".join(unchecked))
    except HarnessError as exc:
        if args.json:  # the records so far, as the text shows its lines so far; the error line follows
            print(_json(args.series, records, str(exc)))
        raise
    if args.json:
        print(_json(args.series, records, None))
    return 0


def _json(series: str, records: list[dict], error: str | None) -> str:
    """--json: every record, counts per status ("not checked" never counts as passing), the error if any."""
    count = {s: sum(r["status"] == s for r in records) for s in ("applies", "not checked")}
    return json.dumps({"series": series, "results": records, "applies": count["applies"],
                       "not_checked": count["not checked"], "error": error}, indent=2)
