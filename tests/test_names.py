"""xla_harness/names.py holds each name the CLI shares with the library once: no other module of the
package assigns one of its names at module level, nor a copy of one of its strings or tuples under
another name (the CLI once kept its own PROTOCOLS, COMMITS, INJECT_KINDS, ... to stay free of jax)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "xla_harness"
NAMES = "names.py"


def _module_level(tree: ast.Module) -> list[tuple[str, ast.expr | None]]:
    """(name, value) of every assignment at module level (inside module-level if/try blocks too)."""
    found: list[tuple[str, ast.expr | None]] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        found.append((t.id, node.value))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.append((node.target.id, node.value))
        elif isinstance(node, ast.If | ast.Try):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)
    return found


def _literal(value: ast.expr | None):
    """The value of a string or tuple-of-strings literal, else None."""
    if value is None:
        return None
    try:
        v = ast.literal_eval(value)
    except ValueError:
        return None
    return v if isinstance(v, str) or (isinstance(v, tuple) and v and all(isinstance(x, str) for x in v)) else None


def copies(package: Path) -> list[str]:
    """Where a module other than names.py assigns a name of names.py, or one of its strings or tuples."""
    shared = dict(_module_level(ast.parse((package / NAMES).read_text())))
    values = {v: name for name, node in shared.items() if (v := _literal(node)) is not None}
    out = []
    for path in sorted(package.rglob("*.py")):
        if path == package / NAMES:
            continue
        where = path.relative_to(package.parent)
        for name, node in _module_level(ast.parse(path.read_text(), str(path))):
            if name in shared:
                out.append(f"{where}: {name}")
            elif (v := _literal(node)) is not None and v in values:
                out.append(f"{where}: {name} copies {values[v]}")
    return out


def test_names_holds_the_shared_names():
    shared = {name for name, _ in _module_level(ast.parse((PACKAGE / NAMES).read_text()))}
    assert {"BUILTIN_PROGRAM", "PROTOCOLS", "COMMITS", "INJECT_KINDS", "BLOCK_ROWS", "EXPLAIN_MAX_STEPS",
            "DEFAULT_REPLAYS", "EXPLAIN_MAX", "COMPILE_RESULTS"} <= shared


def test_each_shared_name_is_assigned_once():
    assert copies(PACKAGE) == []


@pytest.mark.parametrize(("planted", "said"), [
    ('PROTOCOLS = ("train", "frozen")\n', "xla_harness/commands/stress.py: PROTOCOLS"),
    ('if True:\n    BUILTIN_PROGRAM: str = "x"\n', "xla_harness/commands/stress.py: BUILTIN_PROGRAM"),
    ('KINDS = ("nan", "nan-opt", "inf-opt", "lost-row", "doubled-row")\n',
     "xla_harness/commands/stress.py: KINDS copies INJECT_KINDS"),
])
def test_a_planted_copy_is_caught(tmp_path, planted, said):
    package = tmp_path / "xla_harness"
    (package / "commands").mkdir(parents=True)
    (package / NAMES).write_text((PACKAGE / NAMES).read_text())
    (package / "commands" / "stress.py").write_text("from xla_harness.names import PROTOCOLS\n\n" + planted)
    assert copies(package) == [said]


@pytest.mark.slow
def test_names_imports_no_jax():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import xla_harness.names"],
                         capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    modules = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "xla_harness.names" in modules
    assert [m for m in modules if m.split(".")[0] in ("jax", "jaxlib")] == []
