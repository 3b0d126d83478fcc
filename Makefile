# xla-harness: every user-facing target depends on `setup`, so a fresh clone needs
# nothing but `make stress` or `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

DEFAULT_JAX_PIN := 0.12.0.1
JAX_PIN  ?= $(DEFAULT_JAX_PIN)
ifeq ($(shell printf '%s' '$(JAX_PIN)' | grep -Ex '[0-9]+([.][0-9]+){1,3}'),)
$(error JAX_PIN=$(JAX_PIN) is not a jax version (e.g. 0.12.0.1); nothing was made)
endif
# The harness runs on the jax users have (0.9 to 0.12): another pin gets its own venv, so
# `make test-fast JAX_PIN=0.9.0.1` leaves .venv alone.
VENV     ?= $(if $(filter $(DEFAULT_JAX_PIN),$(JAX_PIN)),.venv,.venv-jax$(JAX_PIN))
# jax/jaxlib >= 0.11 have wheels for Python >= 3.12 only; older pins take pyproject's floor (3.11).
PY_MIN   ?= $(shell case "$(JAX_PIN)" in (0.[0-9].*|0.10.*) echo 3.11;; (*) echo 3.12;; esac)
# flax for examples/flax_tied at this pin: flax >= 0.12.9 needs jax >= 0.11.1 (and Python 3.12),
# 0.12.7/0.12.8 jax >= 0.10, 0.12.6 jax >= 0.8.1. FLAX_PIN= installs no flax (its test skips).
FLAX_PIN ?= $(shell case "$(JAX_PIN)" in (0.[0-9].*) echo 0.12.6;; (0.10.*|0.11.0) echo 0.12.8;; (*) echo 0.12.12;; esac)
PY       := $(VENV)/bin/python
comma    := ,
STAMP    := $(VENV)/.setup-$(JAX_PIN)
OUT      ?= out
# Default stress matrix: the six configurations of jax-ml/jax#35409, sized for a CPU.
STRESS_ARGS ?= --modes full,sparse_only,dense_only --remat on,off --seeds 1,2,3,4 --steps 20

.PHONY: help setup setup-targets setup-browser stress test test-fast lint bench clean

help:
	@echo "make stress     run the default tied-embedding stress matrix and print the table"
	@echo "make triage     every verdict about the #35409 program (scale 1/32) on host, tpu:v6e:2x4 and cuda:h100, in one report (TRIAGE_ARGS=, TRIAGE_TARGETS=)"
	@echo "make test       make lint, then the test suite (what CI runs)"
	@echo "make test-fast  the suite without the tests marked slow (subprocesses, whole training runs): a few minutes"
	@echo "make setup      create $(VENV) with a Python >= $(PY_MIN), jax==$(JAX_PIN) and flax==$(FLAX_PIN) [JAX_PIN=0.9.0.1 ...]"
	@echo "make setup-targets  add libtpu and the CUDA plugin to $(VENV)/xla-harness-targets (only the harness uses them): --target tpu:v6e:2x4 / cuda:h100 compile without the hardware [CUDA_MAJOR=13]"
	@echo "make setup-browser  install headless Chromium (Debian's package) for the test that renders the triage report as a page"
	@echo "make tpu-matrix [MATRIX_PINS=..] the #35409 program at full size compiled by libtpu for v6e:2x4 per jax/libtpu (results/tpu-aot)"
	@echo "make tpu-sweep  [SWEEP='jit=bare ..'] the report's unknowns (jit placement, donation, dtype, embedding spec, precision) one at a time, full + remat (results/tpu-aot/sweep)"
	@echo "make gpu-fidelity [AUTOTUNE=file]  the #35409 program compiled ahead of time for cuda:h200 (jax 0.11.2, CUDA 13 plugin) against the H200's own compile, fusion by fusion (results/gpu/.../fidelity)"
	@echo "make gpu-evidence [GPU_EVIDENCE_ARGS=--tiny]  on a GPU machine (its python3, no network): benches, first-failure cost, #35409 frozen + autotune results (results/gpu/<date>-<device>)"
	@echo "make tpu-pairs  [MATRIX_PINS=..] the unknowns (and precision, specs, axis types) pairwise: 15 cells, full + remat (results/tpu-aot/pairs)"
	@echo "make scan       scan the model compiled here for hazardous in-place fusions (ARGS=paths)"
	@echo "make gradcheck  gradient checks on stock jax (MASKING=1: patched jax, flag on; FRAMEWORKS=tf,mlx: also TF and MLX)"
	@echo "make patches-check [XLA_SRC=dir JAX_SRC=dir TF_SRC=dir]  git apply --check the series"
	@echo "make patches-jax-check [JAX_PIN=v]  build .venv-jax-patched (.venv-jax<v>-patched for another pin) from the sdist with its variant of the series; test both venvs"
	@echo "make frameworks-test  TF/MLX gradient tests in .venv-frameworks (part of make test)"
	@echo "make xla-test XLA_SRC=dir [SERIES=..] [STOCK=1]  compile + run XLA's unit tests for the series (no Bazel)"
	@echo "make xla-mutants XLA_SRC=dir  delete each guard of each default XLA patch; every mutant must fail a test"
	@echo "make xla-blast-radius XLA_SRC=dir [MODULES=dir | PREFUSION_TARGET=tpu:v6e:2x4|cuda:h100]  fusion decisions the default series changes"
	@echo "make jax-suite JAX_SRC=dir  jax's own test files, masking flag off and on (results in $(OUT)/jax-suite)"
	@echo "make pr TARGET=xla|jax|tensorflow  write out/pr/<target>/ (mbox, PR.md, CHECKLIST.md)"
	@echo "make build-and-test [JAX_VERSION=v] [DRY_RUN=1] [CUDA=1]  build jaxlib with the series variant for that jax (needs GitHub)"
	@echo "make lint       ruff over the package, tests and benchmarks; the import contracts (lint-imports); mypy"
	@echo "make bench      run the benchmarks in bench/ and print their ratios"
	@echo "make clean      remove the venvs and $(OUT)"

$(STAMP): pyproject.toml tools/find-python
	@py=$$(tools/find-python --min $(PY_MIN)) || exit 2; \
	  echo "setup: creating $(VENV) with $$py"; \
	  rm -rf $(VENV) && "$$py" -m venv $(VENV) || { echo "error: could not create $(VENV) with $$py" >&2; exit 2; }
	$(PY) -m pip install -q --disable-pip-version-check "jax==$(JAX_PIN)" "jaxlib==$(JAX_PIN)" \
	  -e ".[dev,plot$(if $(FLAX_PIN),$(comma)flax)]" $(if $(FLAX_PIN),"flax==$(FLAX_PIN)")
	@touch $@

setup: $(STAMP)

# The ahead-of-time compilers for --target tpu:/cuda: (no TPU or GPU needed): libtpu at the version
# jax[tpu] of the pin asks for and the CUDA plugin (CUDA_MAJOR 12 or 13) at the jaxlib version, without
# NVIDIA's libraries, into a folder of their own that only the harness puts on sys.path: installed into
# site-packages they would change what `import jax` does for everything else in the venv (the plugin's
# cuDNN traceback, libtpu's warnings). xla_harness/targets/devices.py explains; an older layout (the
# compilers in site-packages) is removed first.
CUDA_MAJOR    ?= 12
TARGETS_DIR   := $(VENV)/xla-harness-targets
TARGETS_STAMP := $(VENV)/.targets-$(JAX_PIN)-cuda$(CUDA_MAJOR)
LIBTPU_REQ     = $(shell $(PY) -c 'from importlib.metadata import requires; \
  print(next(r.split(";")[0].replace(" ", "") for r in requires("jax") if r.startswith("libtpu")))')
$(TARGETS_STAMP): $(STAMP)
	$(PY) -m pip uninstall -q -y libtpu jax-cuda12-plugin jax-cuda12-pjrt jax-cuda13-plugin jax-cuda13-pjrt \
	  2>/dev/null || true
	rm -rf $(TARGETS_DIR) $(VENV)/.targets-*
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --target $(TARGETS_DIR) "$(LIBTPU_REQ)" \
	  "jax-cuda$(CUDA_MAJOR)-plugin==$(JAX_PIN)" "jax-cuda$(CUDA_MAJOR)-pjrt==$(JAX_PIN)"
	@touch $@

setup-targets: $(TARGETS_STAMP)

# Headless Chromium (Debian's package) for the test that renders the triage report as a page.
setup-browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; } || \
	  { echo "error: could not install chromium (Debian's package); the report's browser test needs it" >&2; exit 2; }

STRESS_OUT ?= $(OUT)/stress/$(shell date +%Y%m%d-%H%M%S)
stress: setup
	$(VENV)/bin/xla-harness stress $(STRESS_ARGS) --out $(STRESS_OUT) --plot $(STRESS_OUT)/rates.png

test: setup lint
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	$(VENV)/bin/ruff check xla_harness tests bench build tools examples setup.py
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit $$?; done

clean:
	rm -rf $(VENV) .venv-jax[0-9]* .venv-jax-patched .venv-patched .venv-frameworks $(OUT)

# Targets contributed by each part of the project (scan, gradcheck, patches, build).
include $(wildcard mk/*.mk)
