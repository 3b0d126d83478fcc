"""xla-harness pr: prepare an upstream PR bundle (mbox, description, checklist)."""

from __future__ import annotations

import json
from pathlib import Path

NAME = "pr"
HELP = "prepare out/pr/<target>/: series.mbox, PR.md, CHECKLIST.md (xla: APPENDIX.md) from series.toml and results/"
DESCRIPTION = """\
Write the default patches of TARGET as an mbox (git format-patch layout, for `git am`),
a PR description generated from series.toml, the patches' commit messages and the
evidence under results/ (scanner findings, stress tables with environment lines), and the
upstream contribution checklist. For xla, PR.md is what a reviewer reads (under 1,200 words) and
APPENDIX.md holds the evidence. Missing evidence is stated as missing.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("--target", required=True, choices=["xla", "jax", "tensorflow"], help="upstream")
    p.add_argument("--out", type=Path, help="output folder (default out/pr/<target>); files of the bundle "
                                            "already there are replaced only with --force")
    p.add_argument("--series-file", type=Path, help="series.toml (default patches/series.toml)")
    p.add_argument("--results", type=Path, help="results folder (default results/)")
    flags.add_json_argument(p, "the target, the output folder and the files written")
    flags.add_force_argument(p, "bundle files already in the output folder")


def run(args) -> int:
    from xla_harness.commands import flags
    from xla_harness.upstream.pr import BUNDLE_FILES, build_bundle, bundle_inputs
    from xla_harness.upstream.series import load_series

    if args.results is not None and not args.results.is_dir():
        from xla_harness.errors import HarnessError

        raise HarnessError(f"--results {args.results} is not a folder")
    series = load_series(args.series_file)
    out = args.out or Path("out/pr") / args.target
    inputs = flags.input_files([args.series_file or series.root / "series.toml",
                                *bundle_inputs(series, args.target, args.results)])
    for name in BUNDLE_FILES:  # before anything is written: all or nothing
        flags.check_output(out / name, "--out", inputs, args.force)
    bundle = build_bundle(series, args.target, out, args.results)
    if args.json:
        print(json.dumps({"target": args.target, "folder": str(bundle.folder),
                          "files": [str(f) for f in bundle.files]}, indent=2))
    else:
        for f in bundle.files:
            print(f)
    return 0
