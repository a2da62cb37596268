# The two quick-start commands: `make demo` and `make test`. Both set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench drill clean

DEMO_STAMP := $(VENV)/.installed-demo

# The test tooling and every extra: what `make test` needs.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[s3,postgres,serve,dev]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs the package alone (no extras, no test tools).
$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(DEMO_STAMP)

setup: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/chatstate demo

lint: $(STAMP)
	$(BIN)/ruff check chatstate tests examples bench
	$(BIN)/mypy

test: lint
	scripts/test-prereqs
	$(BIN)/pytest -n 2 $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

drill: $(STAMP)
	$(BIN)/chatstate drill --all --trials 200

clean:
	rm -rf $(VENV) .pytest-tmp .mypy_cache .ruff_cache
