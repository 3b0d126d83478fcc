# Ahead-of-time compile matrix: the #35409 program at full size, compiled by libtpu for a TPU
# topology in each jax version's own venv (its own libtpu), nothing run.
#   make tpu-matrix                          modes x remat for every pin, variants for full+remat
#   make tpu-matrix MATRIX_PINS=0.12.0.1     one jax/libtpu version
#   make tpu-matrix MATRIX_OPTIONS="specs=ours axis_types=explicit" MATRIX_OUT=results/tpu-aot/preset-ours-explicit
# The options are named in every label, so records of two readings of the program never mix.
# Each compile takes minutes and ~4 GB on 2 cores; every finished cell is one line of
# OUT/jaxPIN/compile.jsonl (--resume), so a killed matrix resumes where it stopped.
TPU_TARGET      ?= tpu:v6e:2x4
MATRIX_PINS     ?= $(DEFAULT_JAX_PIN) 0.9.0.1
MATRIX_CELLS    ?= full:True full:False sparse_only:True sparse_only:False dense_only:True dense_only:False
MATRIX_VARIANTS ?= baseline,barrier,onehot,sumgrad,tpu-no-fusion
MATRIX_OPTIONS  ?= specs=report axis_types=auto
MATRIX_OUT      ?= results/tpu-aot/report

# The report's unknowns (xla_harness/programs/issue_35409.py's docstring), each a named option of
# the program compiled on its own on top of MATRIX_OPTIONS, full + remat, baseline only:
#   make tpu-sweep [SWEEP="jit=bare dtype=bf16"] [MATRIX_PINS=..]   records in SWEEP_OUT/KEY=VALUE/jaxPIN
SWEEP       ?= jit=bare dtype=bf16 donate=False embed_spec=data,model embed_spec=none,none embed_spec=model,none \
               jit=nested embed_spec=none,data
SWEEP_CELLS ?= full:True
SWEEP_OUT   ?= results/tpu-aot/sweep

# The report's unknowns in combination: a pairwise design (every pair of levels of every two of jit,
# donate, dtype, embed_spec, precision, specs, axis_types in some cell; xla_harness/stress/pairs.py),
# full + remat, each cell one compile, every jax pin in turn, the design checked before any compile:
#   make tpu-pairs [MATRIX_PINS=..]     records in PAIRS_OUT/jaxPIN (resumable like the matrix)
#   $(VENV)/bin/python -m xla_harness.stress.pairs [--summary]    the design, one cell a line
PAIRS_CELLS ?= full:True
PAIRS_OUT   ?= results/tpu-aot/pairs

.PHONY: tpu-matrix tpu-sweep tpu-pairs
tpu-matrix:
	TPU_TARGET="$(TPU_TARGET)" MATRIX_PINS="$(MATRIX_PINS)" MATRIX_CELLS="$(MATRIX_CELLS)" \
	  MATRIX_VARIANTS="$(MATRIX_VARIANTS)" MATRIX_OPTIONS="$(MATRIX_OPTIONS)" MATRIX_OUT="$(MATRIX_OUT)" \
	  DEFAULT_JAX_PIN="$(DEFAULT_JAX_PIN)" tools/tpu-matrix
	$(VENV)/bin/xla-harness report $(MATRIX_OUT) || [ $$? -eq 1 ]

tpu-sweep:
	TPU_TARGET="$(TPU_TARGET)" MATRIX_PINS="$(MATRIX_PINS)" MATRIX_OPTIONS="$(MATRIX_OPTIONS)" SWEEP="$(SWEEP)" \
	  SWEEP_CELLS="$(SWEEP_CELLS)" SWEEP_OUT="$(SWEEP_OUT)" DEFAULT_JAX_PIN="$(DEFAULT_JAX_PIN)" tools/tpu-sweep
	$(VENV)/bin/xla-harness report $(SWEEP_OUT) || [ $$? -eq 1 ]

tpu-pairs: setup
	TPU_TARGET="$(TPU_TARGET)" MATRIX_PINS="$(MATRIX_PINS)" PAIRS_CELLS="$(PAIRS_CELLS)" PAIRS_OUT="$(PAIRS_OUT)" \
	  DEFAULT_JAX_PIN="$(DEFAULT_JAX_PIN)" VENV="$(VENV)" tools/tpu-pairs
	$(VENV)/bin/xla-harness report $(PAIRS_OUT) || [ $$? -eq 1 ]
