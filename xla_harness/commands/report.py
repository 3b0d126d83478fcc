"""xla-harness report: print the table of one or more stress results folders."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from xla_harness.names import COMPILE_RESULTS

NAME = "report"
HELP = "print the non-finite table of stress results folders"
DESCRIPTION = """\
Read OUT/stress*.jsonl from each folder and print the per-configuration table (per-seed
k/n, total, rate, one-sided exact 95% upper bound, seed spread). A folder holding
stress --compile-only records (compile.jsonl, in it or its subfolders: a compile matrix over
jax versions) gets the compile table instead: per configuration and target the versions, the
step fingerprint, libtpu's own aliasing and the scan's hazards. Several folders are combined;
configurations or seeds with missing steps are listed as gaps. A step counts once per
(spec fingerprint, label, seed, step); one label recorded by runs with different options
or different jax settings (jax_default_matmul_precision, jax_enable_x64, ... however set: the
spec's jax_config; a file written before they were recorded counts as unknown settings, pooled
only with files like it) is refused unless --allow-mixed-specs, and so is one configuration
compiled under two sets of jax settings; a step recorded twice with different outcomes is
reported as a warning.

A triage folder (xla-harness triage --out DIR, holding triage.json) gets the triage's answer
again, as triage printed it at its end: the paragraph, where each seed of the frozen and train
stages failed and what to run next; --json prints the document triage --json printed (every rate
with its k and n); --html also draws DIR/report.md and DIR/report.html again. Exit as the
triage's: 0 nothing found, 1 found a problem, 2 nothing measured, a partial answer or not a triage's record.
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    p.add_argument("folders", nargs="+", type=Path, metavar="DIR", help="results folder(s)")
    flags.add_json_argument(p, "the table")
    p.add_argument("--plot", type=Path, metavar="PNG",
                   help="also write a PNG plot (an existing file only with --force; never a results file)")
    flags.add_force_argument(p, "the --plot file")
    p.add_argument("--html", action="store_true",
                   help="a triage folder (xla-harness triage --out DIR): draw DIR/report.md and DIR/report.html again "
                        "from DIR and print its answer")
    p.add_argument("--allow-mixed-specs", action="store_true",
                   help="pool steps of one configuration label recorded by runs with different options "
                        "(refused by default: their steps are different trials)")


def show(args):
    """Print (and plot) the table of args.folders; returns it."""
    from xla_harness.commands import flags
    from xla_harness.stress.report import as_json as report_json
    from xla_harness.stress.report import plot as report_plot
    from xla_harness.stress.report import summary as report

    if args.plot:  # before reading: a refused target costs nothing
        flags.check_output(args.plot, "--plot", flags.input_files(args.folders), args.force)
    table = report.load_table(args.folders, allow_mixed_specs=args.allow_mixed_specs)
    for w in table.warnings:
        sys.stderr.write(f"warning: {w}\n")
    print(report_json.dumps(table) if args.json else report.format_table(table))
    if args.plot:
        report_plot.plot(table, args.plot)
    return table


def _compile_folders(folders: list[Path]) -> bool:
    """Whether every folder holds compile records and none holds stress results."""

    return all(any(Path(f).rglob(COMPILE_RESULTS)) and not any(Path(f).glob("stress*.jsonl")) for f in folders)


def show_compile(args) -> int:
    import json

    from xla_harness.errors import HarnessError
    from xla_harness.stress.compile_only.records import load_compile_records
    from xla_harness.stress.compile_only.table import COMPILE_TABLE_HEADER, check_compile_settings, compile_table_rows
    from xla_harness.table import format_rows

    if args.plot:
        raise HarnessError("--plot draws stress rates; compile records have none")
    records = load_compile_records(args.folders)
    if not args.allow_mixed_specs:
        check_compile_settings(records)
    if args.json:
        print(json.dumps({"configurations": records}, indent=2))
    else:
        print("\n".join(format_rows(compile_table_rows(records), COMPILE_TABLE_HEADER)))
    return 1 if any(r["scan"].get("hazard") or r["scan"].get("decisions") for r in records) else 0


def _triage_folder(folders: list[Path]) -> Path | None:
    """The triage folder among ``folders`` (one holding triage.json, even a broken one), None when none is."""
    found = [Path(f) for f in folders if (Path(f) / "triage.json").exists() or (Path(f) / "triage.json").is_symlink()]
    return found[0] if found else None


def show_triage(args) -> int:
    """A triage folder: its answer again, from DIR/triage.json (what triage printed at its end, or with
    --json the document triage --json printed); with --html the report drawn again too."""
    import json

    from xla_harness.errors import HarnessError
    from xla_harness.triage.answer import answer, read_state
    from xla_harness.triage.render import write_report

    folder = _triage_folder(args.folders) or args.folders[0]
    if len(args.folders) != 1 or args.plot or (args.html and args.json):
        raise HarnessError(f"{folder} is a triage folder: give it alone, without --plot"
                           + (" (and --html without --json)" if args.html and args.json else ""))
    state = read_state(folder)
    ans = write_report(folder, state) if args.html else answer(state, folder)
    if args.json:
        print(json.dumps(ans.to_json(state, folder), indent=1, sort_keys=True))
    else:
        print(ans.text())
        drawn = (folder / "report.md").is_file() and (folder / "report.html").is_file()
        print(f"report: {folder / 'report.md'}, {folder / 'report.html'}" if drawn
              else f"report: not drawn ({shlex.join(['xla-harness', 'report', str(folder), '--html'])} draws it)")
    if ans.exit_code == 2:
        sys.stderr.write(f"error: {ans.not_clean()}\n")
    return ans.exit_code


def run(args) -> int:
    if args.html and _triage_folder(args.folders) is None:
        from xla_harness.errors import HarnessError

        named = " or ".join(str(f) for f in args.folders)
        raise HarnessError(f"{named}: not a triage folder (no triage.json); --html draws a triage's report")
    if _triage_folder(args.folders) is not None:
        return show_triage(args)
    if all(Path(f).is_dir() for f in args.folders) and _compile_folders(args.folders):
        return show_compile(args)
    show(args)
    return 0
