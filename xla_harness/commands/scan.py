"""xla-harness scan: find in-place fusions that read their operand through a data-moving
transpose or reshape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.names import BUILTIN_PROGRAM
from xla_harness.runtime.files import read_regular

NAME = "scan"
HELP = "scan compiled HLO for in-place fusions traced through transpose/reshape"
DESCRIPTION = """\
Scan HLO text (a file, a --xla_dump_to directory, or - for standard input) or, with
--model, a program's training step compiled on the current backend exactly as a plain
jax.jit of it (the user's step, unchanged; --program FILE.py:NAME for yours, the built-in
tied-embedding by default), and classify every in-place fusion output (scatter,
dynamic-update-slice, annotated aliasing) under three tracing policies:

  aliased                 stock XLA, the as-reported patch and the layout-aware patch all
                          pair the output with its fusion parameter;
  layout-preserving-miss  stock XLA misses the pair, but the transpose/reshape on the way
                          is a bitcast under its layouts (safe to trace through);
  hazard                  only the as-reported patch (any transpose/reshape) pairs it: the
                          op on the way moves data, so an in-place write would overwrite
                          what it still reads.

Directories: *after_optimizations.txt files are scanned, each with its
*-buffer-assignment.txt (and *-buffer-assignment-values.txt) when present: the compiler's own
in-place decision where the HLO states none (GPU, CPU: the fusion's output and its in-place
operand in one buffer slice), set against the walk; and do a hazard's output and source share an
allocation? Without such files, any *.txt / *.hlo starting with 'HloModule' is scanned.

Memory plan: each module with a buffer assignment (a dump folder, or --model compiled for a tpu:/cuda:
target) is also checked as `xla-harness memcheck` checks it: two live values on the same bytes, a
read after an in-place write, an async operation's bytes touched in flight (a conflict counts as a
finding), and, where the compiler dumped its live range, ours against it (differences are listed,
not findings). --no-memcheck leaves it out. See docs/memcheck.md.

On GPU modules the instructions the GPU runs non-deterministically are listed with their source
lines: scatters whose indices are not marked unique, applied with atomic read-modify-writes, with a
combiner whose result depends on the order of the updates (a float add); they do not change the
exit code.
Exit codes: 0 nothing found, 1 at least one hazard, scatter-fused-with-data-moving-producer or
memory-plan conflict, 2 a usage or parse error (bad files are reported one line each; the others are still scanned).
"""


def add_arguments(p) -> None:
    from xla_harness.commands import flags

    # str, not Path: scan isolates each bad file itself (FIFOs and devices included: one error line
    # each, the other files still scanned) rather than the CLI refusing the whole command.
    p.add_argument("paths", nargs="*", type=str, metavar="PATH",
                   help="HLO text file or dump directory; - reads one module's HLO text from standard input "
                        f"(at most {STDIN_MAX_BYTES >> 20} MiB)")
    flags.add_json_argument(p, "the findings")
    p.add_argument("--all", action="store_true", help="list aliased fusions too in the table")
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu", "tpu", "unknown"],
                   help="whose alias rules count as stock (default: read from the dump)")
    p.add_argument("--model", nargs="?", const=True, default=None, metavar="PROGRAM",
                   help="compile the step of --program (or of PROGRAM given here) on the current backend and "
                        "scan it")
    flags.add_program_arguments(p)
    flags.add_single_config_arguments(p)
    p.add_argument("--devices", type=flags.positive, default=None,
                   help="with --model: shard the built-in over N devices, or give a program devices=N (its "
                        "factory must take devices=; a --program-option devices= that differs is refused) "
                        "(default 1; with --target tpu:/cuda:, all of the target's devices)")
    flags.add_target_argument(p)
    flags.add_autotune_argument(p)
    p.add_argument("--save-hlo", type=Path, metavar="FILE",
                   help="with --model: write the compiled HLO text (an existing file only with --force; "
                        "never a scanned file or a results file)")
    flags.add_force_argument(p, "the --save-hlo file")
    p.add_argument("--no-memcheck", dest="memcheck", action="store_false",
                   help="do not check the memory plan of modules with a buffer assignment (memcheck)")
    flags.add_model_arguments(p)


# Standard input ("-"): read at most this much (a file is read whole; a pipe could never end).
STDIN_MAX_BYTES = 1 << 30
_STDIN = Path("<stdin>")  # the target standing for "-", told apart by identity (a file may be named so)


def _read_stdin() -> str:
    """HLO text from standard input: at most STDIN_MAX_BYTES bytes, UTF-8; a terminal is refused."""
    limit = STDIN_MAX_BYTES
    stdin = sys.stdin
    stream = getattr(stdin, "buffer", None)
    if stream is None:
        raise HarnessError("-: standard input is closed")
    try:
        tty = stdin.isatty()
    except (OSError, ValueError):
        tty = False
    if tty:
        raise HarnessError("-: standard input is a terminal; pipe HLO text in (e.g. xla-harness scan - < m.hlo)")
    try:
        data = stream.read(limit + 1)
    except (OSError, ValueError) as exc:
        raise HarnessError(f"<stdin>:1: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if len(data) > limit:
        raise HarnessError(f"<stdin>: more than {limit} bytes of HLO text; refusing (scan a file instead)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HarnessError(f"<stdin>:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                           f"{exc.start})") from None


def _irregular(path: Path) -> bool:
    """A path that is there but no regular file (a FIFO, a socket, a device, a folder, a dangling or
    looping link): reading it could block or never end, so it is refused, never opened."""
    try:
        return (path.exists() or path.is_symlink()) and not path.is_file()
    except OSError:
        return True


def _dir_targets(d: Path) -> tuple[list[tuple[Path, Path | None]], list[str]]:
    """The dumps to scan in folder ``d`` (each with its buffer assignment when there is one) and one
    error per file scan would read that is no regular file (the others are still scanned)."""
    errors: list[str] = []
    named = sorted(d.rglob("*after_optimizations.txt"))
    errors += [f"{p} is not a regular file (skipped: it could block)" for p in named if _irregular(p)]
    files = [p for p in named if p.is_file()]
    if files:
        out = []
        for f in files:
            ba = f.with_name(f.name[:-len(".txt")] + "-buffer-assignment.txt")
            out.append((f, ba if (ba.exists() or ba.is_symlink()) else None))
        return out, errors
    cands = sorted(p for p in d.rglob("*") if p.suffix in (".txt", ".hlo") and p not in named)
    errors += [f"{p} is not a regular file (skipped: it could block)" for p in cands if _irregular(p)]
    out = []
    for f in cands:
        if not f.is_file():
            continue
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                head = fh.read(4096).lstrip()
        except OSError:
            continue
        if head.startswith("HloModule"):
            out.append((f, None))
    if not out and not errors:
        raise HarnessError(f"{d}: directory holds no HLO text (*after_optimizations.txt, or *.txt/*.hlo "
                           "starting with 'HloModule')")
    return out, errors


def _target_model_text(args) -> tuple[str, str | None, str | None, str, str | None]:
    """(HLO text, buffer assignment text, its values file's text, device kind, the compiler's live
    range text) of --model compiled for a tpu:/cuda: target."""
    from xla_harness.commands import flags
    from xla_harness.stress.compile_only.run import compile_program
    from xla_harness.targets.devices import target_devices

    if args.devices is None and args.program == BUILTIN_PROGRAM:
        args.devices = len(target_devices(args.target))
    options = flags.program_options(args)
    if args.program == BUILTIN_PROGRAM:
        options["devices"] = args.devices
    compiled = compile_program(args.program, options, args.target)
    return (compiled.hlo_text, compiled.buffer_assignment, compiled.buffer_values, compiled.device_kind,
            compiled.live_range)


def _model_text(args) -> tuple[str, str, str, str | None, str | None, str | None]:
    """(HLO text, module label, backend rules, buffer assignment text or None, its values file's text
    or None, the compiler's live range text or None) of --model."""
    from xla_harness.commands import flags
    from xla_harness.stress.distributed import ensure_host_devices
    from xla_harness.targets.devices import prepare_environment

    if isinstance(args.model, str):
        args.program = args.model
    from xla_harness.targets.envcheck import check_compiler_environment

    check_compiler_environment(args.target)  # XLA_FLAGS, LIBTPU_INIT_ARGS, JAX_PLATFORMS: before jax starts
    prepare_environment(args.target)
    ba_text = values_text = live_range = None
    if not args.target.is_host:
        text, ba_text, values_text, kind, live_range = _target_model_text(args)
        where, known = f"{args.target} ({kind})", args.target.backend
    else:
        options = flags.program_options(args)  # before --devices defaults: devices= only when asked for
        ensure_host_devices(args.devices or 1)
        import jax

        from xla_harness.stress.runner import compile_train_step

        text = compile_train_step(options, program=args.program).as_text()
        where = jax.default_backend()
        known = where if where in ("cpu", "gpu", "tpu") else "unknown"
    if args.save_hlo:
        try:
            args.save_hlo.parent.mkdir(parents=True, exist_ok=True)
            args.save_hlo.write_text(text)
        except OSError as exc:
            raise HarnessError(f"cannot write {args.save_hlo}: {exc.strerror}") from None
    what = f"{args.mode}/remat={args.remat}/{args.dtype}" if args.program == BUILTIN_PROGRAM else args.program
    label = f"<{'tied-embedding ' if args.program == BUILTIN_PROGRAM else ''}{what} on {where}>"
    return text, label, known, ba_text, values_text, live_range


def _check_request(args) -> None:
    """Something to scan; --save-hlo only with --model, and never over a scanned file, the program's
    file or a results file (another existing file only with --force). Checked before anything runs."""
    from xla_harness.commands import flags

    if not args.paths and not args.model:
        raise HarnessError("give HLO files or dump directories to scan, or --model [PROGRAM]")
    if isinstance(args.model, str):
        args.program = args.model
    if args.model:
        flags.program_options(args)  # the program's options and --devices, checked before anything starts
    else:
        for flag, given in (("--program-option", args.program_option), ("--devices", args.devices is not None)):
            if given:
                raise HarnessError(f"{flag} needs --model (it is an option of the program --model compiles)")
    if not args.target.is_host and not args.model:
        raise HarnessError("--target needs --model (it says what the program is compiled for)")
    if args.autotune_results is not None:
        if not args.model:
            raise HarnessError("--autotune-results needs --model (it goes into the compile --model makes)")
        flags.apply_autotune_argument(args)  # into XLA_FLAGS, before jax starts
    if args.save_hlo is None:
        return
    if not args.model:
        raise HarnessError("--save-hlo needs --model (it writes the HLO text that --model compiles)")
    inputs = flags.input_files([Path(p) for p in args.paths if p != "-"], results_in_folders=False)
    program = args.model if isinstance(args.model, str) else args.program
    module_part = program.rsplit(":", 1)[0] if ":" in program else ""
    if module_part.endswith(".py") or "/" in module_part:
        inputs |= flags.input_files([Path(module_part)])
    flags.check_output(args.save_hlo, "--save-hlo", inputs, args.force)


def _collect_targets(paths: list[str]) -> tuple[list[tuple[Path, Path | None]], int]:
    targets: list[tuple[Path, Path | None]] = []
    errors = 0
    if paths.count("-") > 1:
        raise HarnessError("- (standard input) is named more than once")
    for name in paths:
        if name == "-":
            targets.append((_STDIN, None))
            continue
        p = Path(name)
        try:
            if p.is_dir():
                found, bad = _dir_targets(p)
                targets.extend(found)
                for line in bad:
                    sys.stderr.write(f"error: {line}\n")
                errors += len(bad)
            elif p.exists():
                targets.append((p, None))
            else:
                raise HarnessError(f"{p}: no such file or directory")
        except HarnessError as exc:
            sys.stderr.write(f"error: {exc}\n")
            errors += 1
    return targets, errors


def _scan_one(path: Path, ba_path: Path | None, backend: str, memcheck: bool):
    """(module, findings, decisions, backend, buffer assignment, memory plan) of one file; HarnessError
    when bad."""
    from xla_harness.hlo import buffers
    from xla_harness.hlo.parser import parse_file, parse_module
    from xla_harness.hlo.scan import detect_backend, scan

    mod = parse_module(_read_stdin(), str(_STDIN)) if path is _STDIN else parse_file(path)
    ba = buffers.load_buffer_assignment(ba_path) if ba_path else None
    if backend == "auto":
        backend = detect_backend(mod, str(path))
    findings, decisions, backend = scan(mod, backend, ba)
    plan = None
    if memcheck and ba is not None and ba_path is not None:
        lr = ba_path.with_name(ba_path.name.replace("-buffer-assignment.txt", "-live-range.txt"))
        plan = _memory_plan(mod, ba, ba_path, read_regular(lr).decode("utf-8", errors="replace") if lr.is_file()
                            else None, str(path), backend)
    return mod, findings, decisions, backend, ba, plan


def _memory_plan(mod, ba, ba_path: Path | None, live_range: str | None, label: str, backend: str):
    """memcheck's report on one module (its buffer assignment, the compiler's live range where dumped),
    or why the plan was not checked (files that are not one compile's, a cut buffer assignment)."""
    from xla_harness.hlo.memplan import check_module, inputs

    try:
        ba_text = inputs.read_text(ba_path) if ba_path is not None else None  # --model: the compile just made
        if ba_text is not None:
            inputs.check_buffer_text(ba_text, str(ba_path))
        return check_module(mod, ba, live_range, label, backend if backend in ("cpu", "gpu", "tpu") else "",
                            ba_text=ba_text, names=(str(ba_path), f"{label} (live range)"))
    except HarnessError as exc:
        return str(exc)


def _plan_lines(plan) -> list[str]:
    """What scan prints of a memory plan: one line, then each conflict (at most 5) and the count of
    live-range differences; or why it was not checked."""
    if isinstance(plan, str):
        return ["  memory plan: not checked (the error line says why)"]
    if plan.live_range_compared < 0:
        lr = "no live range dumped"
    else:
        differ = len(plan.disagreements)
        lr = (f"its live range as the compiler's on {plan.live_range_compared} values" if not differ else
              f"its live range differs from the compiler's on {differ} of {plan.live_range_compared} values "
              "(listed by `xla-harness memcheck`; not a finding)")
    lines = [f"  memory plan: {len(plan.conflicts)} conflict(s) in {plan.values} values, {plan.allocations} "
             f"allocations, {plan.async_windows} async windows; {lr}"]
    lines += [f"  memory plan conflict: {c.message}" for c in plan.conflicts[:5]]
    if len(plan.conflicts) > 5:
        lines.append(f"  ... {len(plan.conflicts) - 5} more (xla-harness memcheck lists them all)")
    return lines


def _model_buffers(label: str, ba_text: str | None, values_text: str | None, target):
    """The buffer assignment of a --model compile with the values file read into it, as ``scan DIR``
    reads a dump: the GPU compiler's own in-place decision. What the compiler did not write is said on
    standard error (never silently dropped): without the values file an operand's value is looked for
    by name only, so some outputs get no verdict; without the assignment a GPU target gets none."""
    from xla_harness.hlo import buffers

    if not ba_text:
        if target.backend == "gpu":
            sys.stderr.write(f"warning: {label}: the compiler wrote no buffer assignment; the GPU compiler's own "
                             "in-place decisions are not read\n")
        return None
    ba = buffers.parse_buffer_assignment(ba_text, f"{label} buffer assignment")
    if values_text is not None:
        ba.uses = buffers.parse_value_uses(values_text, f"{label} buffer-assignment values")
    else:
        sys.stderr.write(f"warning: {label}: the compiler wrote a buffer assignment but no values file "
                         "(*-buffer-assignment-values.txt); operands' values are looked for by name only, and an "
                         "output whose operand value is not found that way gets no compiler verdict\n")
    return ba


def _module_json(module, findings, decisions, backend, plan=None) -> dict:
    """A module's findings as JSON, with the instructions it runs non-deterministically where its
    backend is assessed (``nondeterministic``: absent otherwise) and memcheck's report where its
    memory plan was checked (``memory_plan``: absent otherwise)."""
    from xla_harness.hlo.nondeterminism import ASSESSED, nondeterministic_ops
    from xla_harness.hlo.scan import module_json

    out = module_json(module, findings, decisions, backend)
    if backend in ASSESSED:
        out["nondeterministic"] = [op.to_json() for op in nondeterministic_ops(module, backend)]
    if isinstance(plan, str):
        out["memory_plan"] = {"not_checked": plan}
    elif plan is not None:
        out["memory_plan"] = plan.as_dict()
    return out


def _print_module(m, fs, ds, be, ba, plan, show_aliased: bool) -> None:
    """One scanned module as text: its findings, what it runs non-deterministically, where a hazard's
    output and source lie in the buffer assignment, and its memory plan."""
    from xla_harness.hlo import buffers
    from xla_harness.hlo.nondeterminism import format_ops, nondeterministic_ops
    from xla_harness.hlo.scan import format_findings

    print(format_findings(m, fs, show_aliased=show_aliased, decisions=ds, backend=be))
    for line in format_ops(nondeterministic_ops(m, be), be):
        print(line)
    if ba is not None:
        for f in fs:
            if f.cls == "hazard" and f.source:
                print("  buffers: " + buffers.compare(ba, f.fusion, tuple(f.output_index), f.source).sentence())
    for line in _plan_lines(plan) if plan is not None else []:
        print(line)


def run(args) -> int:
    from xla_harness.hlo.parser import parse_module
    from xla_harness.hlo.scan import scan

    _check_request(args)
    targets, errors = _collect_targets(args.paths)
    scanned = []  # (module, findings, decisions, backend, buffer-assignment or None, memory plan or None)
    for path, ba_path in targets:
        try:
            scanned.append(_scan_one(path, ba_path, args.backend, args.memcheck))
        except HarnessError as exc:
            sys.stderr.write(f"error: {exc}\n")
            errors += 1
        except (Exception, RecursionError) as exc:  # noqa: BLE001 - one bad file must not stop the scan
            sys.stderr.write(f"error: {path}:1: could not be scanned ({type(exc).__name__}: {exc})\n")
            errors += 1
    if args.model:
        text, label, model_backend, ba_text, values_text, live_range = _model_text(args)
        mod = parse_module(text, label)
        ba = _model_buffers(label, ba_text, values_text, args.target)
        found = scan(mod, model_backend if args.backend == "auto" else args.backend, ba)
        plan = _memory_plan(mod, ba, None, live_range, label, found[2]) if args.memcheck and ba is not None else None
        scanned.append((mod, *found, ba, plan))
    hazards = sum(f.cls == "hazard" for _, fs, _, _, _, _ in scanned for f in fs)
    n_decisions = sum(len(ds) for _, _, ds, _, _, _ in scanned)
    for *_, plan in scanned:
        if isinstance(plan, str):  # the plan's files are not one compile's, or cut: no verdict on it
            sys.stderr.write(f"error: memory plan not checked: {plan}\n")
            errors += 1
    conflicts = sum(len(plan.conflicts) for *_, plan in scanned if plan is not None and not isinstance(plan, str))
    plans = sum(plan is not None and not isinstance(plan, str) for *_, plan in scanned)
    if args.json:
        print(json.dumps({"modules": [_module_json(m, fs, ds, be, plan) for m, fs, ds, be, _, plan in scanned]},
                         indent=2))
    else:
        for m, fs, ds, be, ba, plan in scanned:
            _print_module(m, fs, ds, be, ba, plan, show_aliased=args.all)
        print(f"scanned {len(scanned)} module(s): {hazards} hazard(s), {n_decisions} "
              "scatter-fused-with-data-moving-producer"
              + (f", {conflicts} memory-plan conflict(s) in {plans} memory plan(s) checked" if plans else "")
              + (f", {errors} file(s) could not be read" if errors else ""))
    if errors:
        return 2
    return 1 if hazards or n_decisions or conflicts else 0
