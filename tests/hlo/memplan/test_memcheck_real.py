"""memcheck on committed real dumps (libtpu and XLA:GPU), unedited and with minimal edits: the model
errors found on them stay fixed, and each planted fault class (overlap, in-place, donation, async, live
range) is caught on a real dump of each compiler (the matrix is in docs/memcheck.md)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from xla_harness.hlo.buffers import parse_buffer_assignment
from xla_harness.hlo.memplan import beside, check_texts, checks, read_text, stages
from xla_harness.hlo.parser import parse_module

ROOT = Path(__file__).resolve().parents[3]
# libtpu, jax 0.9: async collective fusions (AsyncCollectiveStart, continuation fusions, done)
TPU_LARGE = "results/tpu-aot/pairs/jax0.9.0.1/hlo/*auto_donate=True_dtype=bf16*-7f42a06a.after_optimizations.txt.gz"
# libtpu, jax 0.12: copy-start/copy-done windows
TPU_SMALL = "results/tpu-aot/pairs/jax0.12.0.1/hlo/*auto_donate=False_dtype=f32*-7c73ca78.after_optimizations.txt.gz"
# libtpu, jax 0.12: parameters donated (input_output_alias) and written in place
TPU_DONATED = "results/tpu-aot/pairs/jax0.12.0.1/hlo/*explicit_donate=True*-80bf2aaa.after_optimizations.txt.gz"
# XLA:GPU, jax 0.9: all-reduce-start/done in place, parameters donated
GPU = "results/cuda-aot/report-xla_gpu_enable_triton_gemm=false/jax0.9.0.1/hlo/*-cd022fc1.after_optimizations.txt.gz"
# XLA:GPU on an H100: a module dumped with its live range
GPU_LIVE_RANGE = "results/gpu/h100-2026-11-28/memory-plan/dump/module_0000.*_after_optimizations.txt.gz"


def _files(pattern: str) -> dict[str, str]:
    found = sorted(ROOT.glob(pattern))
    assert len(found) == 1, pattern
    lr = beside(found[0], "live-range")
    return {"hlo": read_text(found[0]), "ba": read_text(beside(found[0], "buffer-assignment")),
            "lr": read_text(lr) if lr else ""}


@pytest.fixture(scope="module")
def tpu_large() -> dict[str, str]:
    return _files(TPU_LARGE)


@pytest.fixture(scope="module")
def tpu_small() -> dict[str, str]:
    return _files(TPU_SMALL)


@pytest.fixture(scope="module")
def tpu_donated() -> dict[str, str]:
    return _files(TPU_DONATED)


@pytest.fixture(scope="module")
def gpu() -> dict[str, str]:
    return _files(GPU)


@pytest.fixture(scope="module")
def gpu_live_range() -> dict[str, str]:
    return _files(GPU_LIVE_RANGE)


def _check(files: dict[str, str], backend: str, **edits):
    f = {**files, **edits}
    return check_texts(f["hlo"], f["ba"], f["lr"] or None, "real-dump", backend)


def _clean(files: dict[str, str], backend: str) -> None:
    r = _check(files, backend)
    assert r.timed > 0 and r.conflicts == [] and r.disagreements == [], _messages(r)


def _found(r, kind: str, a: str, b: str, text: str = "") -> bool:
    """Whether ``r`` has a ``kind`` conflict between values ``a`` and ``b`` whose message holds ``text``."""
    return any(c.kind == kind and (c.data["a"]["value"], c.data["b"]["value"]) == (a, b) and text in c.message
               for c in r.conflicts)


def _plant_read(hlo: str, after: str, value: str) -> str:
    """The module with ``%planted = negate(%value)`` scheduled right after the instruction ``after``."""
    line = re.search(rf"^(\s*)(?:ROOT )?%{re.escape(after)} = .*$", hlo, re.M)
    shape = re.search(rf"^\s*(?:ROOT )?%{re.escape(value)} = (\S+) ", hlo, re.M)
    assert line and shape, (after, value)
    planted = f"\n{line.group(1)}%planted = {shape.group(1)} negate(%{value})"
    return hlo[:line.end()] + planted + hlo[line.end():]


def _messages(r) -> list[str]:
    return [c.message for c in r.conflicts][:5]


def test_async_collective_fusions_carrying_a_parameter_through_are_not_writes(tpu_large):
    # allocation 4 holds param.326 and the aliased outputs {0} of async-collective-start.4 and {1} of
    # its continuation fusions (fusion.5518 ...): the fusions pass the parameter through unwritten,
    # and multiply_add_fusion.78 reads it at the end. Counted as writes: 359 false conflicts.
    r = _check(tpu_large, "tpu")
    assert r.timed > 20_000 and r.async_windows > 0
    assert r.conflicts == [], _messages(r)


def test_a_continuation_fusion_that_writes_its_aliased_output_is_caught(tpu_large):
    hlo = tpu_large["hlo"]
    head = re.search(r"^%async_collective_fusion\.5518 .*$", hlo, re.M)
    assert head
    root = re.compile(r"^(\s*ROOT %tuple\.1629 = .* tuple\(%convolution\.1598, )%param_0\.15858", re.M)
    m = root.search(hlo, head.end())
    assert m
    planted = "  %planted = bf16[4096,512]{1,0:T(8,128)(2,1)} negate(%param_0.15858)\n"
    edited = hlo[:m.start()] + planted + m.group(1) + "%planted" + hlo[m.end():]
    r = _check(tpu_large, "tpu", hlo=edited)
    assert any(c.kind == "donation" and c.data["a"]["value"] == "param.326" and c.data["b"]["value"] ==
               "fusion.5518{1}" for c in r.conflicts), _messages(r)


def test_an_in_place_all_reduce_reading_its_operand_until_its_done_is_not_a_conflict(gpu):
    # all-reduce-start.131 writes over loop_add_fusion.11 in place and reads it until its done:
    # counted against its own write, 159 false conflicts
    r = _check(gpu, "gpu")
    assert r.async_windows > 0
    assert r.conflicts == [], _messages(r)


def test_another_reader_of_an_in_place_all_reduce_operand_inside_its_window_is_caught(gpu):
    hlo = gpu["hlo"]
    line = re.search(r"^(\s*)%all-reduce-start\.131 = (\S+) all-reduce-start\((%[\w.\-]+)\).*$", hlo, re.M)
    assert line
    planted = f"\n{line.group(1)}%planted = {line.group(2)} negate({line.group(3)})"
    r = _check(gpu, "gpu", hlo=hlo[:line.end()] + planted + hlo[line.end():])
    assert any(c.kind == "in-place" and "planted reads" in c.message for c in r.conflicts), _messages(r)


def _window_victim(files: dict[str, str]) -> tuple[str, str]:
    """(copy-start name, value label): a value written inside a copy-start/copy-done window, of the
    memory space of the copy's destination and no larger."""
    s = stages(parse_module(files["hlo"], "d"), parse_buffer_assignment(files["ba"], "d"), "tpu")
    tl, dones, values = s.plan.tl, s.plan.dones, s.live.values
    for _, ins in tl.order:
        if ins.opcode != "copy-start" or ins.name not in dones:
            continue
        ts, td = tl.time[ins.name], tl.time[dones[ins.name]]
        dest = [values[v] for v in s.flow.at((ins.name, (0,)))]
        if len(dest) != 1 or td - ts < 3:
            continue
        for v in values.values():
            if ts < v.start < td and checks.written(s, v) and v.v.color == dest[0].v.color and \
                    0 < v.v.size <= dest[0].v.size and not v.v.index:
                return ins.name, v.label
    raise AssertionError("no copy window with a value written inside")


def _move_onto(ba: str, victim: str, target: str) -> str:
    """The buffer assignment with ``victim``'s value line moved into ``target``'s allocation, at its offset."""
    vline = re.search(rf"^ value: <\d+ {re.escape(victim)} @\d+> \(size=\d+,offset=\d+\).*\n", ba, re.M)
    tline = re.search(rf"^ value: <\d+ {re.escape(target)} @\d+> \(size=\d+,offset=(\d+)\).*\n", ba, re.M)
    assert vline and tline
    moved = re.sub(r"offset=\d+", f"offset={tline.group(1)}", vline.group(0), count=1)
    out = ba[:tline.end()] + moved + ba[tline.end():]
    shift = len(moved) if vline.start() >= tline.end() else 0  # the victim right after the target included
    return out[:vline.start() + shift] + out[vline.end() + shift:]


def test_a_value_written_onto_a_copy_destination_inside_its_window_is_caught(tpu_small):
    clean = _check(tpu_small, "tpu")
    assert clean.async_windows > 0 and clean.conflicts == [], _messages(clean)
    start, victim = _window_victim(tpu_small)
    r = _check(tpu_small, "tpu", ba=_move_onto(tpu_small["ba"], victim, f"{start}{{0}}"))
    assert any(c.kind == "async" and start in c.message and c.data["b"]["value"] == victim
               for c in r.conflicts), _messages(r)


# ---------------------------------------------------------------- the planted-fault matrix (GPU and TPU)


def test_tpu_a_value_moved_onto_a_live_neighbours_bytes_is_an_overlap(tpu_small):
    # fusion.5 (live 2882-2888) is defined while fusion.3 (2790-2906) is live, in the same allocation
    _clean(tpu_small, "tpu")
    r = _check(tpu_small, "tpu", ba=_move_onto(tpu_small["ba"], "fusion.5", "fusion.3"))
    assert _found(r, "overlap", "fusion.3", "fusion.5", "both live, not one buffer"), _messages(r)


def test_gpu_a_value_moved_onto_a_live_neighbours_bytes_is_an_overlap(gpu):
    # fusion.568 (live 148-1586) is defined while fusion.566 (64-2469) is live, in the same allocation
    _clean(gpu, "gpu")
    r = _check(gpu, "gpu", ba=_move_onto(gpu["ba"], "fusion.568", "fusion.566"))
    assert _found(r, "overlap", "fusion.566", "fusion.568", "both live, not one buffer"), _messages(r)


def test_tpu_a_reader_after_an_in_place_all_reduce_is_caught(tpu_small):
    # all-reduce.2 writes its result over fusion.848 in place, as fusion.848's last reader
    _clean(tpu_small, "tpu")
    r = _check(tpu_small, "tpu", hlo=_plant_read(tpu_small["hlo"], "all-reduce.2", "fusion.848"))
    assert _found(r, "in-place", "fusion.848", "all-reduce.2", "but planted reads fusion.848"), _messages(r)


def test_tpu_a_read_of_a_donated_parameter_after_its_bytes_are_written_is_caught(tpu_donated):
    # param.2 is donated to output {0}; fusion.122 writes its output {0} over it, as its last reader
    _clean(tpu_donated, "tpu")
    r = _check(tpu_donated, "tpu", hlo=_plant_read(tpu_donated["hlo"], "fusion.122", "param.2"))
    assert _found(r, "donation", "param.2", "fusion.122{0}", "but planted reads param.2"), _messages(r)


def test_gpu_a_read_of_a_donated_parameter_after_its_bytes_are_written_is_caught(gpu):
    # param (parameter 0) is donated to output {0}; copy.848 writes it after param's last read
    _clean(gpu, "gpu")
    r = _check(gpu, "gpu", hlo=_plant_read(gpu["hlo"], "copy.848", "param"))
    assert _found(r, "donation", "param", "copy.848", "but planted reads param"), _messages(r)


def test_gpu_a_value_written_inside_an_all_reduce_window_is_caught(gpu):
    # input_transpose_fusion.35 runs at 1160, inside all-reduce-start.89's window (1155-1164): put it
    # on the bytes the all-reduce writes in place
    _clean(gpu, "gpu")
    r = _check(gpu, "gpu", ba=_move_onto(gpu["ba"], "input_transpose_fusion.35", "all-reduce-start.89"))
    assert any(c.kind == "async" and c.data["a"]["value"] == "all-reduce-start.89" and
               c.data["b"]["value"] == "input_transpose_fusion.35" and
               "input_transpose_fusion.35 writes input_transpose_fusion.35 at 1160 while all-reduce-start.89 "
               "(1155-1164) writes those bytes" in c.message for c in r.conflicts), _messages(r)


def test_gpu_a_shrunk_live_range_is_a_disagreement(gpu_live_range):
    _clean(gpu_live_range, "gpu")
    assert _check(gpu_live_range, "gpu").live_range_compared == 2
    lr = re.sub(r"^(\s+copy\.1\{\}:1-)2$", r"\g<1>1", gpu_live_range["lr"], flags=re.M)
    assert lr != gpu_live_range["lr"]
    r = _check(gpu_live_range, "gpu", lr=lr)
    assert r.conflicts == [] and any(d.startswith("live range: copy.1{}: compiler 1-1") for d in r.disagreements), \
        r.disagreements


def test_gpu_a_read_of_an_all_reduce_result_before_its_done_is_caught(gpu):
    # all-reduce-start.89 (1155-1164) writes its result until all-reduce-done: a reader of the result
    # inside the window (the done scheduled after that reader) reads bytes still being written. Missed
    # before: the operation's own values were left out of the window's reads.
    _clean(gpu, "gpu")
    r = _check(gpu, "gpu", hlo=_plant_read(gpu["hlo"], "all-reduce-start.89", "all-reduce-start.89"))
    assert _found(r, "async", "all-reduce-start.89", "all-reduce-start.89",
                  "planted reads all-reduce-start.89 at 1156 while all-reduce-start.89 (1155-1165) writes it, "
                  "before its done"), _messages(r)


def test_tpu_a_read_of_a_copy_destination_before_its_done_is_caught(tpu_small):
    # copy-start.902 copies constant.584 into {0} until its copy-done: read {0} inside the window
    _clean(tpu_small, "tpu")
    hlo = tpu_small["hlo"]
    line = re.search(r"^(\s*)%copy-start\.902 = \((\S+), .*$", hlo, re.M)
    assert line
    planted = f"\n{line.group(1)}%planted = {line.group(2)} negate(%copy-start.902#0)"
    r = _check(tpu_small, "tpu", hlo=hlo[:line.end()] + planted + hlo[line.end():])
    assert _found(r, "async", "copy-start.902{0}", "copy-start.902{0}",
                  "planted reads copy-start.902{0} at 480 while copy-start.902 (479-496) writes it, "
                  "before its done"), _messages(r)


LIVE_RANGE_AOT = {"cuda": ROOT / "results/cuda-aot/live-range", "tpu": ROOT / "results/tpu-aot/live-range"}


@pytest.mark.parametrize("compiler", ["cuda", "tpu"])
def test_ahead_of_time_compiles_with_the_compilers_own_live_range(compiler):
    """The #35409 step at scale 1/32 compiled ahead of time (triage's compile, which keeps the compiler's
    live range): no conflict; every value the compiler times is timed here (the GPU printer hides the
    async wrapped computations of its collectives: their values are tied to their starts) and agrees
    with the compiler's live range."""
    from xla_harness.hlo.memplan import check_files
    from xla_harness.hlo.timeline import parse_live_range

    module = next(LIVE_RANGE_AOT[compiler].glob("*.after_optimizations.txt.gz"))
    r = check_files(module)
    xla_timed = len(parse_live_range(read_text(beside(module, "live-range"))).ranges)
    assert r.conflicts == [] and r.disagreements == [], r.disagreements[:3]
    assert r.live_range_compared == xla_timed and r.timed >= xla_timed  # 2,640 of 2,799 (cuda) before the ties
    text = gzip.decompress(module.read_bytes()).decode()
    hidden = {v for v in re.findall(r"^ value: <\d+ ([^\s{@>]+)", read_text(beside(module, "buffer-assignment")), re.M)
              if f"%{v} = " not in text}
    assert bool(hidden) == (compiler == "cuda"), sorted(hidden)[:3]  # the GPU printer hides them; libtpu's not


def test_a_natively_async_ops_reducer_is_not_flattened():
    """reduce-scatter-start (the printed sugar of an async reduce-scatter) names its reducer with
    to_apply: it runs inside the op, not in the schedule (flattened, every later time shifted)."""
    from xla_harness.hlo.parser import parse_module
    from xla_harness.hlo.timeline import called_in_order, flatten

    text = """HloModule m, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}

ENTRY %e (p: f32[8]) -> f32[4] {
  %p = f32[8]{0} parameter(0)
  %rs-start = ((f32[8]{0}), f32[4]{0}) reduce-scatter-start(%p), replica_groups={{0,1}}, dimensions={0}, to_apply=%add
  ROOT %rs-done = f32[4]{0} reduce-scatter-done(%rs-start)
}
"""
    m = parse_module(text)
    assert called_in_order(m.by_name["e"].by_name["rs-start"]) == []
    assert [i.name for _, i in flatten(m).order] == ["p", "rs-start", "rs-done"]


def _aot(compiler: str) -> dict[str, str]:
    module = next(LIVE_RANGE_AOT[compiler].glob("*.after_optimizations.txt.gz"))
    return {"hlo": read_text(module), "ba": read_text(beside(module, "buffer-assignment")),
            "lr": read_text(beside(module, "live-range"))}


def test_a_collective_starts_operands_live_until_its_done_as_xla_says():
    """XLA:GPU prints all-gather-start and all-reduce-start as ``((operands), outputs)``: the start holds
    operand k at {0, k} until the done reads it, and the done's result is the start's {1}. Read as one
    operand at {0} (and an all-reduce-done as the start's whole tuple), 130 of 2640 values ended where
    the compiler's live range does not: operands at the start instead of the done, start tuples at the
    done's readers."""
    files = _aot("cuda")
    m = parse_module(files["hlo"])
    s = stages(m, parse_buffer_assignment(files["ba"]), "gpu")
    operand_ends = s.plan.tl.at(s.live.values[s.plan.by_pos[("loop_and_select_fusion", (1,))]].end)
    tuple_ends = s.plan.tl.at(s.live.values[s.plan.by_pos[("all-reduce-start", ())]].end)
    del s  # (a failing assert would print it whole)
    assert operand_ends == "all-gather-done"  # held by all-gather-start{0,0} until its done
    assert tuple_ends == "all-reduce-done"  # the tuple itself dies at the done
    r = _check(files, "gpu")
    assert r.live_range_compared > 2000 and r.disagreements == [], r.disagreements[:3]


def test_libtpu_aliasing_the_buffer_assignment_did_not_take_is_not_one_buffer():
    """pow.9 and pow.8 both declare (aliasing_operands) that pow.2's bytes may hold their output; the
    buffer assignment put pow.8 there and pow.9 elsewhere. Grouping both with pow.2 cut pow.2's interval
    at pow.9 (4 disagreements with libtpu's live range)."""
    files = _aot("tpu")
    r = _check(files, "tpu")
    assert r.conflicts == [] and r.disagreements == [] and r.aliasing_not_taken >= 1, r.disagreements
    assert r.live_range_compared > 5000


def test_libtpu_aliasing_taken_twice_onto_an_operand_still_read_is_caught():
    """Plant the buffer assignment taking both: pow.9 onto pow.2's bytes, while pow.8 still reads pow.2
    after pow.9 has written them."""
    files = _aot("tpu")
    r = _check(files, "tpu", ba=_move_onto(files["ba"], "pow.9", "pow.2"), lr="")
    assert _found(r, "in-place", "pow.2", "pow.9", "pow.9 writes pow.9 over pow.2 at 503, but pow.8 reads pow.2 "
                  "at 504"), _messages(r)


def test_tpu_a_shrunk_live_range_is_a_disagreement():
    """libtpu writes its live range too (results/tpu-aot/live-range): one end moved earlier in it is
    listed against ours."""
    files = _aot("tpu")
    lr = re.sub(r"^(\s+sub\.255\{\}:505-)4490$", r"\g<1>4000", files["lr"], flags=re.M)
    assert lr != files["lr"]
    r = _check(files, "tpu", lr=lr)
    assert r.conflicts == [] and len(r.disagreements) == 1, r.disagreements
    assert r.disagreements[0].startswith("live range: sub.255{}: compiler 505-4000 (sub.255 .. ")
    assert r.disagreements[0].endswith("ours 505-4490 (sub.255 .. multiply_add_fusion.2)"), r.disagreements


def test_libtpu_async_collective_fusions_are_windows(tpu_large):
    """libtpu's async collectives are fusions: one rooted at the AsyncCollectiveStart custom-call,
    continuation fusions carrying its buffers on (outputs aliased to the operands they take them
    from), one rooted at AsyncCollectiveDone. Each start is paired with its done through the buffers
    it writes (the source it carries may be shared by several collectives) and checked as a window."""
    from xla_harness.hlo.memplan.model import fused_root_target

    m = parse_module(tpu_large["hlo"])
    st = stages(m, parse_buffer_assignment(tpu_large["ba"]), "tpu")
    starts = sum(fused_root_target(m, ins) == "AsyncCollectiveStart" for _, ins in st.plan.tl.order)
    pairs = [(s.name, d.name) for s, d in checks.collective_fusions(st)]
    del st
    assert starts == 238 and len(pairs) == starts and len({s for s, _ in pairs}) == starts
    assert ("async-collective-start.4", "async-collective-done.4") in pairs


def test_a_read_of_a_gathered_buffer_before_its_collective_is_done_is_caught(tpu_large):
    """get-tuple-element.6883 is async-collective-start.4{1}, the buffer the all-gather writes: a
    reader that is not a continuation fusion, between the start and the done, reads it in flight."""
    hlo = tpu_large["hlo"]
    line = re.search(r"^(\s*)%fusion\.5518 = .*$", hlo, re.M)
    assert line
    planted = f"\n{line.group(1)}%planted = bf16[4096,2048]{{1,0:T(8,128)(2,1)S(1)}} negate(%get-tuple-element.6883)"
    r = _check(tpu_large, "tpu", hlo=hlo[:line.end()] + planted + hlo[line.end():])
    assert any(c.kind == "async" and c.data["a"]["value"] == "async-collective-start.4{1}" and
               "planted reads async-collective-start.4{1}" in c.message and
               "while the async collective async-collective-start.4 .. async-collective-done.4" in c.message
               for c in r.conflicts), _messages(r)


def test_a_value_written_onto_a_gathered_buffer_inside_its_collective_is_caught(tpu_large):
    """fusion.9 (written at 1154) moved onto the bytes async-collective-start.4 gathers into, inside its
    window (1062-1194): the collective still holds them."""
    r = _check(tpu_large, "tpu", ba=_move_onto(tpu_large["ba"], "fusion.9", "async-collective-start.4{1}"))
    assert any(c.kind == "async" and c.data["b"]["value"] == "fusion.9" and
               "fusion.9 writes fusion.9 at 1154 while the async collective async-collective-start.4 .. "
               "async-collective-done.4 (1062-1194) holds those bytes" in c.message for c in r.conflicts), \
        _messages(r)


# XLA:GPU (the CUDA plugin, ahead of time, 2 devices): collectives printed as async-start wrapping an
# all-gather / reduce-scatter / all-reduce computation, get-tuple-elements printed as 'x#k'
GPU_WRAPPED = "results/cuda-aot/live-range-async-wrapped/*.after_optimizations.txt.gz"


@pytest.fixture(scope="module")
def gpu_wrapped() -> dict[str, str]:
    return _files(GPU_WRAPPED)


def _timed(files: dict[str, str]) -> checks.Stages:
    return stages(parse_module(files["hlo"]), parse_buffer_assignment(files["ba"]), "gpu")


def test_async_starts_wrapping_a_collective_agree_with_xlas_live_range(gpu_wrapped):
    """`async-start(...), calls=%async_computation` wrapping a collective: all 256 values the compiler
    times agree with its live range. Each of three rules is needed (without it: disagreements):
    a wrapped root's tuple table is its own buffer, not the start's {1} (3); a value of the wrapped
    computation is live from the async start, as XLA times it (16, and a false in-place conflict:
    the wrapped all-reduce.32 writing over wrapped_concatenate, which its own start reads); a tuple's
    operand printed 'x#k' is read by a get-tuple-element, which keeps x's tuple table live (8)."""
    r = _check(gpu_wrapped, "gpu")
    assert r.conflicts == [] and r.live_range_compared == 256
    assert r.disagreements == [], r.disagreements[:3]
    st = _timed(gpu_wrapped)
    table, start_out = st.plan.by_pos[("all-gather.16", ())], st.plan.by_pos[("all-gather-start.2", (1,))]
    apart = st.buffers.of(table) != st.buffers.of(start_out)
    rs = st.live.values[st.plan.by_pos[("reduce-scatter.9", ())]]
    live_from = st.plan.tl.at(rs.start)
    fused = st.live.values[st.plan.by_pos[("loop_add_fusion.8", ())]]
    read_by = st.plan.tl.at(fused.end)
    del st
    assert apart  # two allocations in the buffer assignment: not one buffer
    assert live_from == "reduce-scatter-start"  # not where the wrapped computation is flattened
    assert read_by == "tuple.38"  # loop_add_fusion.8#0 .. #2 are read for the root tuple


def test_a_value_written_onto_a_wrapped_collectives_output_in_flight_is_caught(gpu_wrapped):
    """Planted: partition-id.3, which runs between all-gather-start.2 and its done, put on the bytes of
    all-gather.16{1} (the wrapped all-gather's output, written until the done): an async conflict."""
    r = _check(gpu_wrapped, "gpu", ba=_move_onto(gpu_wrapped["ba"], "partition-id.3", "all-gather.16{1}"))
    assert any(c.kind == "async" and "all-gather-start.2" in c.message and c.data["b"]["value"] == "partition-id.3"
               for c in r.conflicts), _messages(r)
