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
               jit=nested embed_spec=none,data precision=high precision=highest
SWEEP_CELLS ?= full:True
SWEEP_OUT   ?= results/tpu-aot/sweep

# The report's unknowns in combination: a pairwise design (every pair of levels of every two of jit,
# donate, dtype, embed_spec, precision, specs, axis_types in some cell; xla_harness/stress/report/pairs.py),
# full + remat, each cell one compile, every jax pin in turn, the design checked before any compile:
#   make tpu-pairs [MATRIX_PINS=..]     records in PAIRS_OUT/jaxPIN (resumable like the matrix)
#   $(VENV)/bin/python -m xla_harness.stress.report.pairs [--summary]    the design, one cell a line
PAIRS_CELLS ?= full:True
PAIRS_OUT   ?= results/tpu-aot/pairs

.PHONY: tpu-matrix tpu-sweep tpu-pairs triage
tpu-matrix: setup
	CHECK_PY="$(PY)" TPU_TARGET="$(TPU_TARGET)" MATRIX_PINS="$(MATRIX_PINS)" MATRIX_CELLS="$(MATRIX_CELLS)" \
	  MATRIX_VARIANTS="$(MATRIX_VARIANTS)" MATRIX_OPTIONS="$(MATRIX_OPTIONS)" MATRIX_OUT="$(MATRIX_OUT)" \
	  DEFAULT_JAX_PIN="$(DEFAULT_JAX_PIN)" tools/tpu-matrix
	$(VENV)/bin/xla-harness report $(MATRIX_OUT) || [ $$? -eq 1 ]

tpu-sweep: setup
	CHECK_PY="$(PY)" TPU_TARGET="$(TPU_TARGET)" MATRIX_PINS="$(MATRIX_PINS)" MATRIX_OPTIONS="$(MATRIX_OPTIONS)" SWEEP="$(SWEEP)" \
	  SWEEP_CELLS="$(SWEEP_CELLS)" SWEEP_OUT="$(SWEEP_OUT)" DEFAULT_JAX_PIN="$(DEFAULT_JAX_PIN)" tools/tpu-sweep
	$(VENV)/bin/xla-harness report $(SWEEP_OUT) || [ $$? -eq 1 ]

# Ahead of time held against a GPU's own compile (not part of CI: it needs the device's jax and its CUDA
# plugin in their own venv). The #35409 program (full + remat, one device) compiled for FIDELITY_TARGET
# with jax FIDELITY_PIN and the CUDA FIDELITY_CUDA plugin, compared fusion by fusion with the committed
# compile of the H200 (results/gpu/); the table goes to FIDELITY_OUT/table.md. AUTOTUNE=FILE loads a
# device's autotune results into the ahead-of-time compile. One compile: ~20 s CPU, ~1 GB. A rerun
# replaces FIDELITY_OUT's table, its data and the earlier compile in FIDELITY_OUT/aot (--force; an aot/
# holding anything else is refused, and a failed compile leaves the earlier one).
FIDELITY_PIN    ?= 0.11.2
FIDELITY_CUDA   ?= 13
FIDELITY_TARGET ?= cuda:h200:1x1x1
FIDELITY_DEVICE ?= results/gpu/h200-2026-11-26/compile-only
FIDELITY_OUT    ?= results/gpu/h200-2026-11-26/fidelity
FIDELITY_VENV   := $(if $(filter $(DEFAULT_JAX_PIN),$(FIDELITY_PIN)),.venv,.venv-jax$(FIDELITY_PIN))

.PHONY: gpu-fidelity
gpu-fidelity:
	$(MAKE) --no-print-directory setup-targets JAX_PIN=$(FIDELITY_PIN) CUDA_MAJOR=$(FIDELITY_CUDA)
	$(FIDELITY_VENV)/bin/python tools/gpu_fidelity.py --device $(FIDELITY_DEVICE) --out $(FIDELITY_OUT) \
	  --target $(FIDELITY_TARGET) $(if $(AUTOTUNE),--autotune-results $(AUTOTUNE)) --force

# Every verdict about the #35409 program at scale 1/32, per compiler (this machine's, libtpu for
# v6e:2x4, the CUDA plugin for an H100), in one report: OUT/triage/<time>/report.{md,html}.
TRIAGE_OUT     ?= $(OUT)/triage/$(shell date +%Y%m%d-%H%M%S)
TRIAGE_TARGETS ?= host,tpu:v6e:2x4,cuda:h100
TRIAGE_ARGS    ?= --program issue-35409 --program-option scale=0.03125 --budget 20
triage: setup-targets
	$(VENV)/bin/xla-harness triage $(TRIAGE_ARGS) --target $(TRIAGE_TARGETS) --out $(TRIAGE_OUT) || [ $$? -eq 1 ]

tpu-pairs: setup
	CHECK_PY="$(PY)" TPU_TARGET="$(TPU_TARGET)" MATRIX_PINS="$(MATRIX_PINS)" PAIRS_CELLS="$(PAIRS_CELLS)" PAIRS_OUT="$(PAIRS_OUT)" \
	  DEFAULT_JAX_PIN="$(DEFAULT_JAX_PIN)" VENV="$(VENV)" tools/tpu-pairs
	$(VENV)/bin/xla-harness report $(PAIRS_OUT) || [ $$? -eq 1 ]

# The GPU evidence (#43) in one command, on a machine with a GPU and its own jax (no venv, no network:
# the device's python3 with this checkout on PYTHONPATH): benches, the first failure's cost, #35409
# frozen with per-leaf nondeterminism and the autotune results, in GPU_EVIDENCE_BUDGET seconds;
# results/gpu/<date>-<device>/README.md. GPU_EVIDENCE_ARGS=--tiny runs it at a CPU's size.
GPU_EVIDENCE_PY     ?= python3
GPU_EVIDENCE_BUDGET ?= 480
.PHONY: gpu-evidence
gpu-evidence:
	PYTHONPATH=$(CURDIR) $(GPU_EVIDENCE_PY) tools/gpu_evidence.py --budget $(GPU_EVIDENCE_BUDGET) $(GPU_EVIDENCE_ARGS)
