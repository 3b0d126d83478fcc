# TensorFlow and MLX for the cross-framework gradient table, in their own venv
# (tensorflow-cpu and mlx wheels are for Python 3.12 here; the main .venv may be 3.13).
#   make gradcheck FRAMEWORKS=tf,mlx   build .venv-frameworks and the TF op library, print the table
#   make frameworks-test               run tests/frameworks in that venv (part of make test;
#                                      FRAMEWORKS_TEST=0 skips it with a "not checked" line)
TF_PIN  ?= 2.21.0
MLX_PIN ?= 0.32.4
FRAMEWORKS_VENV  := .venv-frameworks
FRAMEWORKS_PY    := $(FRAMEWORKS_VENV)/bin/python
FRAMEWORKS_STAMP := $(FRAMEWORKS_VENV)/.setup-tf$(TF_PIN)-mlx$(MLX_PIN)-jax$(JAX_PIN)
TF_OPLIB := $(OUT)/tf-oplib/harness_grad_ops.so
TF_OPLIB_STOCK := $(OUT)/tf-oplib-stock/harness_grad_ops.so
TF_CONTROL_OUT ?= $(OUT)/tf-control
FRAMEWORKS_TEST ?= 1

.PHONY: frameworks-venv tf-oplib tf-control frameworks-test

$(FRAMEWORKS_STAMP): pyproject.toml tools/find-python
	@py=$$(tools/find-python 3.12) || exit 2; \
	  echo "frameworks: creating $(FRAMEWORKS_VENV) with $$py"; \
	  rm -rf $(FRAMEWORKS_VENV) && "$$py" -m venv $(FRAMEWORKS_VENV) || { echo "error: could not create $(FRAMEWORKS_VENV) with $$py" >&2; exit 2; }
	$(FRAMEWORKS_PY) -m pip install -q --disable-pip-version-check "jax==$(JAX_PIN)" "jaxlib==$(JAX_PIN)" \
	  "tensorflow-cpu==$(TF_PIN)" "mlx[cpu]==$(MLX_PIN)" -e ".[dev]"
	@touch $@

frameworks-venv: $(FRAMEWORKS_STAMP)

$(TF_OPLIB): $(FRAMEWORKS_STAMP) xla_harness/gradcheck/tf_oplib/harness_grad_ops.cc xla_harness/gradcheck/tf_oplib/build.py \
             patches/tensorflow/0001-tf2xla-zero-gradient-where-dy-is-zero.patch
	TF_CPP_MIN_LOG_LEVEL=3 nice $(FRAMEWORKS_PY) -m xla_harness.gradcheck.tf_oplib.build --out $(dir $@)

# The control: the same op library built from the lines the patch replaces (TF's stock lowerings).
$(TF_OPLIB_STOCK): $(FRAMEWORKS_STAMP) xla_harness/gradcheck/tf_oplib/harness_grad_ops.cc xla_harness/gradcheck/tf_oplib/build.py \
             patches/tensorflow/0001-tf2xla-zero-gradient-where-dy-is-zero.patch
	TF_CPP_MIN_LOG_LEVEL=3 nice $(FRAMEWORKS_PY) -m xla_harness.gradcheck.tf_oplib.build --side stock --out $(dir $@)

tf-oplib: $(TF_OPLIB) $(TF_OPLIB_STOCK)

#   make tf-control   stock vs patched lowerings under jit_compile in four dtypes, and which bridge
#                     jit_compile uses; writes $(TF_CONTROL_OUT)/control.md (exit 1 if the control fails)
tf-control: $(TF_OPLIB) $(TF_OPLIB_STOCK)
	TF_CPP_MIN_LOG_LEVEL=3 nice $(FRAMEWORKS_PY) -m xla_harness.gradcheck.tf_oplib.control \
	  --patched $(TF_OPLIB) --stock $(TF_OPLIB_STOCK) --out $(TF_CONTROL_OUT)

ifeq ($(FRAMEWORKS_TEST),0)
frameworks-test:
	@echo "not checked: tests/frameworks (TensorFlow, MLX, the patched tf2xla lowerings): FRAMEWORKS_TEST=0"
else
frameworks-test: $(TF_OPLIB) $(TF_OPLIB_STOCK)
	TF_CPP_MIN_LOG_LEVEL=3 XLA_HARNESS_FRAMEWORKS_VENV=1 XLA_HARNESS_TF_OPLIB=$(abspath $(TF_OPLIB)) \
	  XLA_HARNESS_TF_OPLIB_STOCK=$(abspath $(TF_OPLIB_STOCK)) \
	  $(FRAMEWORKS_PY) -m pytest -q -p no:cacheprovider tests/frameworks
endif

test: frameworks-test
