"""The names the CLI shares with the library, each defined once here: the choices and defaults its
flags offer before jax starts (``xla-harness --help`` and argument checks import no jax), and the
library modules that act on them. A leaf module: it imports nothing, so every layer may import it."""

from __future__ import annotations

# The harness's version (``xla_harness.__version__``, pyproject's ``version``): what every record says
# wrote it (xla_harness.stress.results.store).
VERSION = "0.1.0"

# The built-in program: the default --program, and the one a results file names when it names none
# (xla_harness.programs.interface).
BUILTIN_PROGRAM = "tied-embedding"

# stress --protocol, --commit and --inject (xla_harness.stress.spec, xla_harness.stress.device.inject).
PROTOCOLS = ("train", "frozen")
COMMITS = ("block", "step")
INJECT_KINDS = ("nan", "nan-opt", "inf-opt", "lost-row", "doubled-row")

# Rows of a block's array on the device: the largest --block with --commit block
# (xla_harness.stress.device.step_rows, xla_harness.stress.loop.block_size.BlockSize.LIMIT).
BLOCK_ROWS = 1024

# stress --explain-max and --explain-replays (xla_harness.stress.explain, xla_harness.origin.classify).
EXPLAIN_MAX_STEPS = 3
DEFAULT_REPLAYS = 8

# triage --explain-max: failing steps of a stage (over its rounds) whose origin is decided
# (xla_harness.triage.spec).
EXPLAIN_MAX = 3

# stress --compile-only's records in its folder (xla_harness.stress.compile_only.run).
COMPILE_RESULTS = "compile.jsonl"
