"""memcheck on a real CPU dump (compiled here with jax), unedited and with planted faults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xla_harness.errors import HarnessError
from xla_harness.hlo.memplan import beside, check_texts, read_text


def _step(x, y, i):
    import jax
    import jax.numpy as jnp

    def body(c):
        k, a = c
        a = jax.lax.dynamic_update_slice(a, jnp.sin(a[:1]) * 2, (k % 4, 0))
        return k + 1, a

    _, a = jax.lax.while_loop(lambda c: c[0] < 5, body, (0, x))
    b = jax.lax.cond(i > 0, lambda: a * 2 + y, lambda: a - y)
    return a + b, jnp.tanh(b) @ y.T


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> dict[str, str]:
    import jax
    import jax.numpy as jnp

    out = tmp_path_factory.mktemp("memcheck")
    x = jnp.ones((8, 16))
    jax.jit(_step, donate_argnums=(0,)).lower(x, x, 1).compile(
        compiler_options={"xla_dump_to": str(out), "xla_dump_hlo_as_text": True})
    mod = next(p for p in Path(out).glob("*jit__step*after_optimizations.txt"))
    files = {"hlo": read_text(mod), "ba": read_text(beside(mod, "buffer-assignment"))}
    lr = beside(mod, "live-range")
    files["lr"] = read_text(lr) if lr else ""
    return files


def _check(d: dict[str, str], **edits):
    files = {**d, **edits}
    return check_texts(files["hlo"], files["ba"], files["lr"] or None, "cpu-dump")


def _found(r, kind: str, a: str, b: str, text: str = "") -> bool:
    return any(c.kind == kind and (c.data["a"]["value"], c.data["b"]["value"]) == (a, b) and text in c.message
               for c in r.conflicts)


def _value_line(ba: str, name: str) -> re.Match:
    m = re.search(rf"^ value: <\d+ {re.escape(name)} @0> \(size=(\d+),offset=(\d+)\).*$", ba, re.M)
    assert m, name
    return m


NO_LIVE_RANGE = "not checked: this jaxlib's CPU compiler dumps no live range (jaxlib 0.12's does)"


def test_unedited_dump_is_clean_and_agrees_with_the_compilers_live_range(dump):
    r = _check(dump)
    assert r.timed == r.values > 0
    assert r.conflicts == []
    if not dump["lr"]:
        pytest.skip(NO_LIVE_RANGE)
    assert r.live_range_compared > 0 and r.disagreements == []


def test_moving_a_value_onto_a_live_neighbours_bytes_is_an_overlap(dump):
    ba = dump["ba"]
    # the loop counter's copy is live while the predicate fusion's result is: put it on those bytes
    pred = _value_line(ba, "compare_convert_fusion")
    victim = _value_line(ba, "copy.11")
    moved = ba[:victim.start(2)] + pred.group(2) + ba[victim.end(2):]
    r = _check(dump, ba=moved)
    assert any(c.kind == "overlap" and {c.data["a"]["value"], c.data["b"]["value"]} ==
               {"compare_convert_fusion", "copy.11"} for c in r.conflicts), [c.message for c in r.conflicts]


def test_a_reader_after_an_in_place_write_is_caught(dump):
    hlo = dump["hlo"]
    line = re.search(r"^(\s*)%select_dynamic-update-slice_fusion = .*$", hlo, re.M)
    operand = re.search(r"fusion\((%[\w.\-]+#1)", line.group(0)) if line else None
    if operand is None and not dump["lr"]:  # an older XLA (no live range either) prints the loop otherwise
        pytest.skip("not checked: this jaxlib's CPU compiler prints the loop's in-place fusion otherwise "
                    "(the planted reader follows jaxlib 0.12's select_dynamic-update-slice_fusion(...#1))")
    assert line and operand
    param = operand.group(1)
    planted = f"\n{line.group(1)}%planted = f32[8,16]{{1,0}} negate({param})"
    r = _check(dump, hlo=hlo[:line.end()] + planted + hlo[line.end():], lr="")
    assert _found(r, "in-place", "arg_tuple.1{1}", "select_dynamic-update-slice_fusion",
                  "but planted reads arg_tuple.1{1}"), [c.message for c in r.conflicts]


def test_a_read_of_a_donated_parameter_after_its_bytes_are_written_is_caught(dump):
    hlo = dump["hlo"]
    line = re.search(r"^(\s*)%wrapped_add\.1 = .*$", hlo, re.M)
    assert line
    planted = f"\n{line.group(1)}%planted = f32[8,16]{{1,0}} negate(%x.1)"
    r = _check(dump, hlo=hlo[:line.end()] + planted + hlo[line.end():], lr="")
    # wrapped_add.1 writes the result over the donated x.1 (input_output_alias {0}: (0, {}))
    assert _found(r, "donation", "x.1", "wrapped_add.1", "but planted reads x.1"), [c.message for c in r.conflicts]


_COLLECTIVES = """
import re, sys
import jax, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
mesh = Mesh(jax.devices(), ("x",))
def f(a):
    return (jax.lax.psum(a, "x"), jax.lax.all_gather(a, "x"),
            jax.lax.ppermute(a, "x", [(i, (i + 1) % 4) for i in range(4)]))
g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=(P(), P(), P("x")), check_vma=False))
print(g.lower(jnp.ones((16, 8))).compile().as_text())
"""


def test_xla_cpu_has_no_async_op_to_plant_a_window_fault_in(dump):
    """The async cell of the matrix for XLA:CPU: its dumps have no async op of any kind (no
    ``*-start``/``*-done`` pair, no async window), so no async fault is planted on a CPU dump; the GPU
    and TPU dumps have the async tests (tests/hlo/memplan/test_memcheck_real.py). Not even collectives are async on
    XLA:CPU: test_xla_cpu_compiles_collectives_synchronously."""
    r = _check(dump)
    assert r.async_windows == 0 and r.conflicts == []
    assert not [o for o in re.findall(r"= \S+ ([\w-]+)\(", dump["hlo"]) if o.endswith(("-start", "-done", "-update"))]


@pytest.mark.slow
def test_xla_cpu_compiles_collectives_synchronously():
    """all-reduce, all-gather and collective-permute compiled for 4 host devices (a fresh process: the
    device count is fixed when jax starts) stay synchronous: no async op in an XLA:CPU module."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _COLLECTIVES], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ops = set(re.findall(r"= \S+ ([\w-]+)\(", done.stdout))
    assert {"all-reduce", "all-gather", "collective-permute"} <= ops, sorted(ops)
    assert not [o for o in ops if o.endswith(("-start", "-done", "-update"))], sorted(ops)


def test_a_shrunk_live_range_is_a_disagreement(dump):
    if not dump["lr"]:
        pytest.skip(NO_LIVE_RANGE)
    lr = re.sub(r"^(\s+x\.1\{\}:0-)(\d+)", lambda m: m.group(1) + str(int(m.group(2)) - 2), dump["lr"], flags=re.M)
    assert lr != dump["lr"]
    r = _check(dump, lr=lr)
    assert any("x.1{}" in d for d in r.disagreements)


@pytest.mark.parametrize("rule", ["while", "conditional"])
def test_each_grouping_rule_prevents_false_conflicts(dump, rule, monkeypatch):
    """Disabled, or its function replaced by one that joins nothing (the mutant): false conflicts."""
    from xla_harness.hlo.memplan import rules

    assert check_texts(dump["hlo"], dump["ba"], None, "d").conflicts == []
    off = check_texts(dump["hlo"], dump["ba"], None, "d", disabled=frozenset([rule]))
    assert off.conflicts
    monkeypatch.setitem(rules.RULE_FUNCTIONS, rule, lambda plan, flow: [])
    assert check_texts(dump["hlo"], dump["ba"], None, "d").conflicts


def test_a_buffer_assignment_of_nothing_here_is_refused(dump):
    ba = "BufferAssignment:\nallocation 0: size 4, parameter 0:\n value: <1 nowhere @0> (size=4,offset=0): s32[]\n"
    with pytest.raises(HarnessError, match=r"d \(buffer assignment\):3: nowhere is no instruction of the module: the "
                                           "buffer assignment and the module are not one compile's"):
        check_texts(dump["hlo"], ba, None, "d")
