# Two commands do all the set-up: `make test` and `make recipe-multi30k`.
# Both create a local virtual environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
# Users get a normal torch; CI and the dev machines pin the local CPU wheel:
#   make test TORCH_REQ='torch==2.13.0'
TORCH_REQ ?= torch
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test bench bench-preprocess bench-train bench-train-gpu bench-translate bench-decoder-ops bench-decoder-profile bench-scale bench-serve bench-constraints bench-constraint-cost bench-alignment recipe-multi30k recipe-multi30k-distill recipe-wmt14-ende clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "installing $(TORCH_REQ) into $(VENV) (a plain 'torch' is PyTorch's CUDA build: about 3 GB to download; pip names each package it fetches)"
	$(BIN)/python -m pip install --no-compile --progress-bar on "$(TORCH_REQ)"
	$(BIN)/python -m pip install --no-compile --quiet -e ".[test,plot,tensorboard,ct2,serve,serve-test]"
	@# pip compiles the packages' bytecode one file at a time; this does it on every core. A file
	@# that does not compile is left to its import, as pip leaves it (torch ships one for Python 3.12).
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	$(BIN)/python -m nmt.ops.native  # the C++ decoder kernels, where a compiler and ninja are present
	touch $(STAMP)

# Test files are spread over TEST_WORKERS processes (pytest-xdist; a file's tests stay together,
# so its module fixtures are built once): most tests wait on subprocesses and one-thread models.
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10 tests

# Benchmarks print their numbers and write bench/results/*.json (one at a time: they time the CPU).
bench: install
	$(BIN)/python bench/bench_all.py

bench-preprocess: install
	$(BIN)/python bench/bench_preprocess.py

bench-train: install
	$(BIN)/python bench/bench_train.py

# On a GPU: `big`, bf16, the paper's 25k-token batch, newstest text (../shared/data/wmt14) with a 32k joint BPE;
# prints target tokens/s and the MFU against the GPU's measured bf16 matmul peak.
bench-train-gpu: install
	$(BIN)/python bench/bench_train.py --device cuda --arch big --max-tokens 25000 --amp bf16 --data newstest --updates 200

# Trained runs to time, e.g. RUNS="runs/multi30k-en-de"; empty: random models, without CTranslate2.
RUNS ?=
bench-translate: install
	$(BIN)/python bench/bench_translate.py $(RUNS)

# The decoder step's CPU ops (oneDNN products, encoder-decoder attention) against the stock ops.
bench-decoder-ops: install
	$(BIN)/python bench/bench_decoder_ops.py

# Where the decoders' time goes: nmt native and standalone CTranslate2 sampled by Linux `perf`
# on each trained run of RUNS (one thread, the fairseq search both do).
bench-decoder-profile: install
	@test -n "$(RUNS)" || { echo "bench-decoder-profile: set RUNS to trained run directories, e.g. RUNS=runs/multi30k-en-de" >&2; exit 2; }
	$(BIN)/python bench/profile_decoders.py $(RUNS)

# WMT-scale data path on a synthetic 4.5M-pair corpus (newstest lengths): preprocess, batching,
# first update with --distributed-world-size 2 on CPU, big checkpoint write.
bench-scale: install
	$(BIN)/python bench/bench_scale.py

# `nmt serve` under 1, 8 and 32 concurrent clients vs `nmt translate` on the same Multi30k test
# lines; also saves a screenshot of its page to bench/results/serve_page.png.
bench-serve: install
	$(BIN)/python bench/bench_serve.py

# Decoding features on a trained run, e.g. RUN=runs/multi30k-en-de: BLEU and speed with terminology
# constraints sampled from the references, and --prefix-file against CTranslate2's target_prefix.
RUN ?= runs/multi30k-en-de
bench-constraints: install
	$(BIN)/python bench/bench_constraints.py $(RUN)

# Alignment error rate of --print-alignment per decoder layer, on 29 hand-aligned Multi30k pairs.
# The constrained search's cost per phrase: one sentence at beam 16 with 0, 1, 4, 16 and 62 one-word
# phrases, on a random tiny model (RUN=... times a trained one).
bench-constraint-cost: install
	$(BIN)/python bench/bench_constraints.py $(if $(filter-out runs/multi30k-en-de,$(RUN)),$(RUN)) --phrase-cost

bench-alignment: install
	$(BIN)/python bench/alignment_aer.py $(RUN)

# The main job: Multi30k task 1 end to end, ending with a BLEU score and RUN_DIR/summary.json.
# Settings are the dicts at the top of recipes/multi30k.py; any of them, and MULTI30K_DIR,
# RUN_DIR, SRC, TGT, pass through the environment, e.g.
#   make recipe-multi30k MULTI30K_DIR=../shared/data/multi30k BUDGET=10m
recipe-multi30k: install
	$(BIN)/python recipes/multi30k.py

# A fast student distilled from recipe-multi30k's teacher (trained first when missing), the same
# student on the original data, and one table of BLEU, size and speed (settings: recipes/multi30k_distill.py):
#   make recipe-multi30k-distill MULTI30K_DIR=../shared/data/multi30k
recipe-multi30k-distill: install
	$(BIN)/python recipes/multi30k_distill.py

# The paper's WMT14 En-De pipeline, for GPU machines (settings: recipes/wmt14_ende.py), e.g.
#   make recipe-wmt14-ende DRY_RUN=1            # print the plan only
#   make recipe-wmt14-ende ARCH=base WMT14_DIR=/data/wmt14
recipe-wmt14-ende: install
	$(BIN)/python recipes/wmt14_ende.py

clean:
	rm -rf $(VENV) build *.egg-info
