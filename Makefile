# Two commands do everything: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: serve test install models lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

models: install
	$(PY) -m backend.fetch

serve: models
	$(PY) -m gateway --host $(HOST) --port $(PORT)

test: models
	$(PY) -m ruff check gateway backend kernels bench tests
	$(PY) -m pytest -q -x --durations=15

bench: models
	$(PY) -m bench.throughput

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
