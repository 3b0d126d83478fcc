# XLA's own unit tests for the patch series, compiled against the XLA inside a pinned
# tf-nightly wheel (no Bazel). Needs g++ and gtest/gmock (apt-get install -y libgtest-dev
# libgmock-dev); downloads the wheel once into ~/.cache/xla-harness/.
#   make xla-test XLA_SRC=dir [SERIES=default|experimental] [STOCK=1 | SOURCES_FROM=dir] [FILTER=gtest-filter] [BASE_REF=jax-v..]
#   make xla-mutants XLA_SRC=dir [BASE_REF=jax-v..]
# BASE_REF picks the series' variant for that base (patches/series.toml); by default the variant
# recorded for the tree's XLA commit (XLA_COMMIT file or git HEAD), else the series' own files.
# Without XLA_SRC both print "not checked: no XLA_SRC" and succeed (CI has no XLA tree);
# `make test` runs both first, so CI's log says so.
# Their logs (and xla-blast-radius's) record this checkout's commit and are the evidence under
# results/xla/: with local changes in the checkout they are refused unless ALLOW_DIRTY=1
# (--allow-dirty; the log then records xla-harness <commit>-dirty and is not evidence).
.PHONY: xla-test xla-mutants xla-blast-radius

test: xla-test xla-mutants

xla-test: setup
	$(PY) -m xla_harness.upstream.xlatest test --series $(or $(SERIES),default) $(if $(BASE_REF),--base-ref $(BASE_REF)) \
	  $(if $(XLA_SRC),--xla-src $(XLA_SRC)) $(if $(STOCK),--stock-sources) \
	  $(if $(SOURCES_FROM),--sources-from $(SOURCES_FROM)) $(if $(FILTER),--filter '$(FILTER)') \
	  $(if $(ALLOW_DIRTY),--allow-dirty)

xla-mutants: setup
	$(PY) -m xla_harness.upstream.xlatest mutants $(if $(XLA_SRC),--xla-src $(XLA_SRC)) $(if $(BASE_REF),--base-ref $(BASE_REF)) \
	  $(if $(ALLOW_DIRTY),--allow-dirty)

# How many fusion decisions the default series changes: the stock and patched
# ShouldFuseInPlaceOp over pre-fusion modules (default: dumped here from the programs of
# xla_harness/upstream/prefusion.py, on CPU or, with PREFUSION_TARGET, as they enter the fusion
# pass of libtpu (tpu:v6e:2x4) or of the CUDA plugin (cuda:h100), ahead of time: make setup-targets).
#   make xla-blast-radius XLA_SRC=dir [MODULES=dir | PREFUSION_TARGET=host|tpu:GEN:SHAPE|cuda:KIND]
PREFUSION_DIR := $(OUT)/prefusion
xla-blast-radius: setup
	@if [ -n "$(XLA_SRC)" ] && [ -z "$(MODULES)" ]; then rm -rf $(PREFUSION_DIR) && \
	  $(PY) -m xla_harness.upstream.prefusion --out $(PREFUSION_DIR) \
	    $(if $(PREFUSION_TARGET),--target $(PREFUSION_TARGET)) || exit $$?; fi
	$(PY) -m xla_harness.upstream.xlatest blast-radius $(if $(XLA_SRC),--xla-src $(XLA_SRC)) \
	  --modules $(or $(MODULES),$(PREFUSION_DIR)) $(if $(ALLOW_DIRTY),--allow-dirty)
