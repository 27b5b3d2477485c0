# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first, and only when the environment has none: a GPU box keeps its own
# CUDA build. PyPI's torch==2.13.0 is a CUDA build on Linux; CPU-only machines may set
# TORCH_SPEC to a CPU wheel or index.
TORCH_SPEC ?= torch==2.13.0
RUN ?= runs/toy

.PHONY: install demo test test-all check docs config-doc clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setuptools' notice on every editable install of a flat layout (folders named like the package
# may shadow it) is silenced by its message alone: deprecations still show.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/mtx toy --output $(RUN)/toy-test --split test
	$(BIN)/mtx prepare --config configs/toy.yaml --set run_dir=$(RUN)
	$(BIN)/mtx train --config configs/toy.yaml --set run_dir=$(RUN) --overwrite
	$(BIN)/mtx translate --checkpoint $(RUN)/checkpoints/best.pt < $(RUN)/toy-test.en > $(RUN)/toy-test.hyp.de
	head -n 3 $(RUN)/toy-test.en $(RUN)/toy-test.hyp.de
	$(BIN)/mtx evaluate --hyp $(RUN)/toy-test.hyp.de --ref $(RUN)/toy-test.de
	$(BIN)/mtx plot $(RUN)

test: install
	$(BIN)/python -m pytest -m "not slow" -q --durations=15

test-all: install
	$(BIN)/python -m pytest -q

check: install
	$(BIN)/ruff format --check mtx benchmarks tests
	$(BIN)/ruff check mtx benchmarks tests

# The manual (docs/), built offline in strict mode: a broken link or a page left out fails.
docs: install
	$(BIN)/mkdocs build --strict

# docs/config.md from the config's declarations (a test fails when it is stale).
config-doc: install
	$(BIN)/python -c "from mtx.config import markdown; print(markdown(), end='')" > docs/config.md

clean:
	rm -rf runs site .pytest_cache
