#!/usr/bin/env python3
"""Write the comparison source for XLA patch 0001's blast radius: the patched
``xla/service/instruction_fusion.cc`` with its data-moving test replaced by GPU's rule for scatter
(``CanEmitInputFusedScatter`` in xla/service/gpu/gpu_fusible.cc: nothing fuses into the in-place
operand, and no producer that reads it fuses), applied to every in-place op 0001 decides. The blast
radius of that source against stock says what adopting GPU's simpler rule generically would refuse:

    python tools/xla_gpu_rule_source.py PATCHED_XLA_TREE OUT_DIR
    python -m xla_harness.upstream.xlatest blast-radius --xla-src XLA --modules out/prefusion --sources-from OUT_DIR

PATCHED_XLA_TREE is an XLA checkout with the default series applied (``git apply`` of 0001).
One ``error:`` line and exit 2 when the tree is not patched as expected.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SOURCE = "xla/service/instruction_fusion.cc"
# 0001's check of the producer of the in-place operand: from its `if` to the brace that closes it
# at the same indentation (its body may log and word its reason as it likes).
DATA_MOVING = re.compile(
    r"^(?P<indent> +)if \(const HloInstruction\* moving =\s+FindDataMovingOp\(producer, alias_info\)\) \{\n"
    r"(?:.*\n)*?(?P=indent)\}$",
    re.MULTILINE)
GPU_RULE = '''        // GPU's rule (CanEmitInputFusedScatter), generically: nothing fuses
        // into the in-place operand.
        return FusionDecision::Forbid("do not fuse into the in-place operand");'''


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("error: usage: xla_gpu_rule_source.py PATCHED_XLA_TREE OUT_DIR", file=sys.stderr)
        return 2
    tree, out = Path(argv[0]), Path(argv[1])
    try:
        text = (tree / SOURCE).read_text(encoding="utf-8")
    except OSError as exc:
        print(f"error: {tree / SOURCE}: {exc.strerror}", file=sys.stderr)
        return 2
    found = list(DATA_MOVING.finditer(text))
    if len(found) != 1:
        print(f"error: {tree / SOURCE}: 0001's data-moving check is not there once (is the series applied?)",
              file=sys.stderr)
        return 2
    dest = out / SOURCE
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text[:found[0].start()] + GPU_RULE + text[found[0].end():], encoding="utf-8")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
