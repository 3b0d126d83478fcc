# Build jaxlib (and with CUDA=1 the CUDA plugin) from source with the patch series, install
# it into .venv-patched and test it. Needs network to GitHub, bazelisk, ~40 GB disk, hours.
#   make build-and-test [DRY_RUN=1] [CUDA=1 [CUDA_MAJOR=12|13]] [SERIES=experimental] [FROM=stage] [TO=stage]
# The work dir is ~/.cache/xla-harness unless XLA_HARNESS_WORK (or WORK_DIR=...) says otherwise.
.PHONY: build-and-test
build-and-test: setup
	$(PY) build/build_jaxlib.py --jax-version $(JAX_PIN) --series $(or $(SERIES),default) \
	  $(if $(CUDA),--cuda $(if $(CUDA_MAJOR),--cuda-major $(CUDA_MAJOR))) $(if $(DRY_RUN),--dry-run) \
	  $(if $(WORK_DIR),--work-dir $(WORK_DIR)) $(if $(FROM),--from $(FROM)) $(if $(TO),--to $(TO))
