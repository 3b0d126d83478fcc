# Patch series: check it applies, and prepare upstream PR bundles.
#   make patches-check [XLA_SRC=dir] [JAX_SRC=dir] [TF_SRC=dir] [SERIES=default|experimental]
#   make pr TARGET=xla|jax|tensorflow
SERIES ?= default
SDIST_DIR := $(OUT)/sdist
JAX_SDIST := $(SDIST_DIR)/jax-$(JAX_PIN)

.PHONY: patches-check pr jax-sdist
$(JAX_SDIST)/PKG-INFO: | setup
	@mkdir -p $(SDIST_DIR)
	$(PY) -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps "jax==$(JAX_PIN)" -d $(SDIST_DIR)
	tar -xzf $(SDIST_DIR)/jax-$(JAX_PIN).tar.gz -C $(SDIST_DIR)
	@touch $@

jax-sdist: $(JAX_SDIST)/PKG-INFO

patches-check: setup $(if $(JAX_SRC),,jax-sdist)
	$(VENV)/bin/xla-harness patches-check --series $(SERIES) \
	  $(if $(XLA_SRC),--xla-src $(XLA_SRC)) --jax-src $(or $(JAX_SRC),$(JAX_SDIST)) \
	  $(if $(TF_SRC),--tf-src $(TF_SRC))

pr: setup
	@test -n "$(TARGET)" || { echo "error: give TARGET=xla|jax|tensorflow" >&2; exit 2; }
	$(VENV)/bin/xla-harness pr --target $(TARGET) --out $(OUT)/pr/$(TARGET) --force
