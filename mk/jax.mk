# JAX zero-cotangent masking patch, built from the PyPI sdist and tested in CI.
#   make patches-jax-check [JAX_PIN=0.9.0.1]   build the patched venv and run tests/jaxpatch in both venvs
# Each pin has its own venvs: stock $(VENV), patched .venv-jax-patched (default pin) or
# .venv-jax<pin>-patched, with the series' variant for that jax (patches/series.toml).
JAX_PATCHED_VENV := $(if $(filter $(DEFAULT_JAX_PIN),$(JAX_PIN)),.venv-jax-patched,.venv-jax$(JAX_PIN)-patched)
JAXPATCH_OUT := $(OUT)/jaxpatch$(if $(filter $(DEFAULT_JAX_PIN),$(JAX_PIN)),,-$(JAX_PIN))

.PHONY: patches-jax-check jax-patched-venv
jax-patched-venv: setup jax-sdist
	$(PY) -m xla_harness.upstream.jaxvenv --sdist $(JAX_SDIST) --archive $(SDIST_DIR)/jax-$(JAX_PIN).tar.gz \
	  --venv $(JAX_PATCHED_VENV) --python $(PY)

patches-jax-check: jax-patched-venv
	@mkdir -p $(JAXPATCH_OUT)
	XLA_HARNESS_JAX_VARIANT=stock XLA_HARNESS_JAX_PIN=$(JAX_PIN) XLA_HARNESS_STOCK_GRADS=$(JAXPATCH_OUT)/stock_grads.npz \
	  $(PY) -m pytest -q -p no:cacheprovider tests/jaxpatch
	XLA_HARNESS_JAX_VARIANT=patched XLA_HARNESS_JAX_PIN=$(JAX_PIN) XLA_HARNESS_STOCK_GRADS=$(JAXPATCH_OUT)/stock_grads.npz \
	  PYTHONPATH=$(CURDIR) $(JAX_PATCHED_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/jaxpatch

test: patches-jax-check
bench: jax-patched-venv

# Gradient checks: stock jax by default; MASKING=1 runs them in .venv-jax-patched with the flag on;
# FRAMEWORKS=tf,mlx runs jax, tf and mlx in .venv-frameworks (mk/frameworks.mk), with tf:jit_patched.
.PHONY: gradcheck
gradcheck: setup $(if $(MASKING),jax-patched-venv) $(if $(FRAMEWORKS),tf-oplib)
ifeq ($(FRAMEWORKS),)
	$(if $(MASKING),PYTHONPATH=$(CURDIR) $(JAX_PATCHED_VENV)/bin/python,$(PY)) -m xla_harness.cli gradcheck $(if $(MASKING),--masking) $(ARGS)
else
	TF_CPP_MIN_LOG_LEVEL=3 XLA_HARNESS_TF_OPLIB=$(abspath $(TF_OPLIB)) \
	  $(FRAMEWORKS_PY) -m xla_harness.cli gradcheck --framework jax,$(FRAMEWORKS) $(ARGS)
endif

# JAX's own test files (a jax-ml/jax source tree in JAX_SRC, with 0002 applied) against the patched
# venv, flag off and on, one file at a time; results in $(OUT)/jax-suite (table.md, summary.json).
#   make jax-suite JAX_SRC=<jax checkout> [FILES=lax_autodiff_test.py,nn_test.py]
.PHONY: jax-suite
jax-suite: $(if $(JAX_SRC),jax-patched-venv,setup)
	@if [ -z "$(JAX_SRC)" ]; then echo "not checked: no JAX_SRC (jax's own tests with the masking flag off/on)"; else \
	  $(JAX_PATCHED_VENV)/bin/python -m pip install -q --disable-pip-version-check absl-py && \
	  nice $(PY) -m xla_harness.upstream.jaxsuite --jax-src "$(JAX_SRC)" --python $(JAX_PATCHED_VENV)/bin/python \
	    --out $(OUT)/jax-suite $(if $(FILES),--files $(FILES)); fi

test: jax-suite
