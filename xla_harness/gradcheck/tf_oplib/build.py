"""Build the op library with the patched tf2xla lowerings against the installed TensorFlow.

The lowerings are taken from the patch file itself: the new text of each hunk of
``tensorflow/compiler/tf2xla/kernels/binary_ops.cc`` (from its first changed line on,
context kept, removed lines dropped), with the three op names prefixed by ``Harness`` so
they register beside TF's own. ``--side stock`` builds the control from the same hunks'
old text (added lines dropped, removed lines kept: TF's own stock lowerings) as ops
``HarnessStockSqrtGrad`` etc., so both libraries load into one process.
``harness_grad_ops.cc`` supplies the op definitions and the ``XLA_MAKE_BINARY`` shape; g++
compiles against ``tf.sysconfig`` include and library dirs.

    python -m xla_harness.gradcheck.tf_oplib.build --out DIR   # prints DIR/harness_grad_ops.so
    python -m xla_harness.gradcheck.tf_oplib.build --out DIR --side stock   # the control
    python -m xla_harness.gradcheck.tf_oplib.build --out DIR --tf-include INC
        # only g++ -fsyntax-only against another TF include tree (e.g. a tf-nightly wheel's
        # tensorflow/include, unpacked), to check the patch's lines against a newer TF's API
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from xla_harness.errors import HarnessError
from xla_harness.runtime import subproc
from xla_harness.runtime.resources import patches_dir

HERE = Path(__file__).resolve().parent
PATCH = patches_dir() / "tensorflow" / "0001-tf2xla-zero-gradient-where-dy-is-zero.patch"
LOWERINGS_FILE = "tensorflow/compiler/tf2xla/kernels/binary_ops.cc"
OPS = ("SqrtGrad", "RsqrtGrad", "ReciprocalGrad")
SIDES = {"patched": "Harness", "stock": "HarnessStock"}  # which text of the hunks -> op name prefix
GXX_TIMEOUT_S = 1800  # one g++ run; then its process group is killed (one error line)
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


def changed_regions(patch_text: str, file: str, side: str = "patched") -> list[str]:
    """For each hunk of ``file``: its new text (``side`` "patched") or old text ("stock") from
    the hunk's first changed line to its end."""
    keep, drop = ("+", "-") if side == "patched" else ("-", "+")
    regions: list[str] = []
    current: str | None = None
    in_hunk = started = False
    lines: list[str] = []

    def flush():
        if lines:
            regions.append("".join(lines))

    for line in patch_text.splitlines(keepends=True):
        m = _DIFF_FILE.match(line.rstrip("\n"))
        if m or line.startswith("-- \n"):
            flush()
            current, in_hunk, started, lines = (m.group(2) if m else None), False, False, []
            continue
        if current != file:
            continue
        if line.startswith("@@"):
            flush()
            in_hunk, started, lines = True, False, []
            continue
        if not in_hunk or line.startswith(("+++", "---")):
            continue
        tag, rest = line[:1], line[1:]
        started = started or tag in (keep, drop)
        if started and tag in (keep, " "):
            lines.append(rest)
    flush()
    return regions


def added_lines(patch_text: str, file: str) -> str:
    """Every line the patch adds to ``file``, in order."""
    out, current = [], None
    for line in patch_text.splitlines(keepends=True):
        m = _DIFF_FILE.match(line.rstrip("\n"))
        if m:
            current = m.group(2)
        elif current == file and line.startswith("+") and not line.startswith("+++"):
            out.append(line[1:])
    return "".join(out)


def lowerings_source(patch_text: str, side: str = "patched") -> str:
    """The patch's lowerings (``side`` "patched": its new lines; "stock": the lines it replaces)
    with the ops renamed HarnessSqrtGrad etc. (HarnessStockSqrtGrad etc. for the stock side)."""
    if side not in SIDES:
        raise HarnessError(f"unknown side {side!r}: expected one of {', '.join(SIDES)}")
    regions = changed_regions(patch_text, LOWERINGS_FILE, side)
    if not regions:
        raise HarnessError(f"the patch changes nothing in {LOWERINGS_FILE}")
    text = "".join(regions)
    for op in OPS:
        text, n = re.subn(rf"(XLA_MAKE_BINARY\(\s*){op}\b", rf"\g<1>{SIDES[side]}{op}", text)
        if n != 1:
            raise HarnessError(f"the {side} side of the patch's {LOWERINGS_FILE} hunks defines {op} {n} times, "
                               "expected once")
    return text


def compile_command(source: Path, include_dir: Path, out: Path | None, tf_include: str,
                    tf_lib: str | None, side: str = "patched") -> list[str]:
    """g++ argv building the op library; with ``out`` None, only -fsyntax-only (no link)."""
    flags = ["-std=c++17", "-w", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DEIGEN_MAX_ALIGN_BYTES=64",
             f'-DHARNESS_OP_PREFIX="{SIDES[side]}"', f"-I{tf_include}",
             f"-I{tf_include}/external/highwayhash", f"-I{tf_include}/external/farmhash_archive/src",
             f"-I{include_dir}"]
    if out is None:
        return ["g++", "-fsyntax-only", *flags, str(source)]
    return ["g++", "-shared", "-fPIC", "-O1", *flags, str(source), "-o", str(out),
            f"-L{tf_lib}", "-l:libtensorflow_framework.so.2", "-l:libtensorflow_cc.so.2"]


def _write_lowerings(out_dir: Path, patch: Path, side: str = "patched") -> None:
    try:
        inc = lowerings_source(patch.read_text(encoding="utf-8"), side)
    except OSError as exc:
        raise HarnessError(f"cannot read {patch}: {exc.strerror}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "patched_lowerings.inc").write_text(inc, encoding="utf-8")


def syntax_check(tf_include: Path, out_dir: Path, patch: Path = PATCH) -> Path:
    """Compile (g++ -fsyntax-only) the patch's lowerings against another TF include tree."""
    if not (tf_include / "tensorflow" / "compiler" / "tf2xla" / "kernels" / "cwise_ops.h").is_file():
        raise HarnessError(f"{tf_include} is not a TensorFlow include tree "
                           "(no tensorflow/compiler/tf2xla/kernels/cwise_ops.h)")
    if shutil.which("g++") is None:
        raise HarnessError("g++ is not installed; the TF op library cannot be built")
    _write_lowerings(out_dir, patch)
    cmd = compile_command(HERE / "harness_grad_ops.cc", out_dir, None, str(tf_include), None)
    res = subproc.run(["nice", *cmd], capture_output=True, text=True, timeout=GXX_TIMEOUT_S,
                      what="g++ -fsyntax-only of the patched lowerings")
    log = out_dir / "syntax-check.log"
    from xla_harness.runtime.files import shown

    log.write_text(shown(" ".join(cmd) + "\n" + res.stdout + res.stderr + f"exit {res.returncode}\n"),
                   encoding="utf-8")
    if res.returncode != 0:
        raise HarnessError(f"the patched lowerings do not compile against {tf_include} (see {log})")
    return log


def build(out_dir: Path, patch: Path = PATCH, side: str = "patched") -> Path:
    if shutil.which("g++") is None:
        raise HarnessError("g++ is not installed; the TF op library cannot be built")
    try:
        import tensorflow as tf
    except ImportError:
        raise HarnessError("tensorflow is not importable in this interpreter; use .venv-frameworks") from None
    _write_lowerings(out_dir, patch, side)
    so = out_dir / "harness_grad_ops.so"
    tmp = out_dir / "harness_grad_ops.so.tmp"
    cmd = compile_command(HERE / "harness_grad_ops.cc", out_dir, tmp, tf.sysconfig.get_include(),
                          tf.sysconfig.get_lib(), side)
    res = subproc.run(cmd, capture_output=True, text=True, timeout=GXX_TIMEOUT_S, what="g++ of the TF op library")
    (out_dir / "build.log").write_text(" ".join(cmd) + "\n" + res.stdout + res.stderr, encoding="utf-8")
    if res.returncode != 0:
        raise HarnessError(f"g++ could not build the TF op library (see {out_dir / 'build.log'})")
    tmp.replace(so)
    return so


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--patch", type=Path, default=PATCH, help="the tensorflow patch (default: the series' 0001)")
    p.add_argument("--side", choices=tuple(SIDES), default="patched",
                   help="patched: the patch's new lines (ops Harness*); stock: the lines it replaces, "
                        "TF's own lowerings, as the control (ops HarnessStock*)")
    p.add_argument("--tf-include", type=Path, default=None,
                   help="only check that the lowerings compile (g++ -fsyntax-only) against this TF include tree")
    args = p.parse_args(argv)
    try:
        if args.tf_include is not None:
            syntax_check(args.tf_include, args.out, args.patch)
            print(f"compiles against {args.tf_include}")
            return 0
        print(build(args.out, args.patch, args.side))
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
