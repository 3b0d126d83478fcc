"""One seed of a prepared configuration run as ``xla-harness stress`` runs it, for the benchmarks that
time the harness against a plain loop (stress_overhead, host_per_step, gpu_breakdown): a results
file with its header, every block appended by the results sink's writer thread (validated, written
whole, fsynced), the file removed afterwards."""

from __future__ import annotations

from pathlib import Path

from xla_harness.stress.results import store as results
from xla_harness.stress.results.sink import ResultsSink
from xla_harness.stress.runner import initial_state, run_seed


def stress_seed(h, seed: int, path: Path, env: dict, size) -> tuple[int, int]:
    """Run ``seed`` of ``h`` to its end into the results file ``path`` (block sizer ``size``, carried from
    seed to seed as stress does); returns the lines and fsyncs written after the header."""
    spec = h.spec.to_dict()
    with results.open_run(path, spec, resume=False) as store:
        store.write_header(spec, env)
        with ResultsSink(store) as sink:
            for _ in run_seed(h, seed, initial_state(h, seed), sink, path.parent, env, block_size=size):
                pass
        counts = store.lines_written - 1, store.fsyncs - 1
    path.unlink()
    return counts
