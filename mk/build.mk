# Build jaxlib (and with CUDA=1 the CUDA plugin) from source with the patch series, install
# it into .venv-patched and test it. Needs bazelisk, network to the hosts docs/workbench.md lists, ~40 GB
# disk, hours. With XLA_SRC=dir and a `make xla-test` target, the quick XLA test runs first and
# a failure stops here, before hours of building.
#   make build-and-test [JAX_VERSION=0.9.0.1] [DRY_RUN=1] [CUDA=1 [CUDA_MAJOR=12|13]] [SERIES=experimental]
#                       [FROM=stage] [TO=stage] [XLA_SRC=dir]
# JAX_VERSION is the jax release built (default JAX_PIN, the harness's own jax); each series applies
# its variant for that release (patches/series.toml), and a release without one is refused.
JAX_VERSION ?= $(JAX_PIN)
# The work dir is ~/.cache/xla-harness unless XLA_HARNESS_WORK (or WORK_DIR=...) says otherwise.
XLA_QUICK_TEST ?= xla-test
.PHONY: build-and-test
build-and-test: setup
	@if [ -n "$(XLA_SRC)" ] && $(MAKE) -s -n $(XLA_QUICK_TEST) XLA_SRC="$(XLA_SRC)" >/dev/null 2>&1; then \
	  echo "quick XLA test first: make $(XLA_QUICK_TEST) XLA_SRC=$(XLA_SRC)"; \
	  $(if $(DRY_RUN),:,$(MAKE) --no-print-directory $(XLA_QUICK_TEST) XLA_SRC="$(XLA_SRC)") || exit $$?; \
	else \
	  echo "not checked first: the quick XLA test ($(if $(XLA_SRC),no xla-test target,no XLA_SRC=dir given))"; \
	fi
	$(PY) build/build_jaxlib.py --jax-version $(JAX_VERSION) --series $(or $(SERIES),default) \
	  $(if $(CUDA),--cuda $(if $(CUDA_MAJOR),--cuda-major $(CUDA_MAJOR))) $(if $(DRY_RUN),--dry-run) \
	  $(if $(WORK_DIR),--work-dir $(WORK_DIR)) $(if $(FROM),--from $(FROM)) $(if $(TO),--to $(TO))
