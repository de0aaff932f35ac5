# Two commands do everything: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: serve test install models test-models lint bench clean redis compose chromium

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

models: install
	$(PY) -m backend.fetch

# The tests run the full-precision model (greedy output is checked against HF's fp32 reference) and the
# quantizer on real layers, so they don't need the AWQ copy that `make serve` builds once.
test-models: install
	$(PY) -m backend.fetch --no-awq

serve: models
	$(PY) -m gateway --host $(HOST) --port $(PORT)

# The Redis-backed cache tests need a redis-server binary (Debian's package); installed here when
# missing and possible (root + apt-get). Otherwise those tests skip, saying why.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) || \
	      echo "make: could not install redis-server; the Redis cache tests will be skipped"; \
	  else \
	    echo "make: redis-server not found and apt-get unavailable (or not root); the Redis cache tests will be skipped"; \
	  fi; \
	}

# `docker compose config` validates compose.yaml in the tests; with no compose plugin for the docker client,
# Debian's docker-compose does (no Docker engine is needed for that). Otherwise that test skips, saying why.
compose:
	@docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null) || \
	      echo "make: could not install docker-compose; the compose test will be skipped"; \
	  else \
	    echo "make: no docker compose and apt-get unavailable (or not root); the compose test will be skipped"; \
	  fi; \
	}

# The dashboard test drives a real headless browser: Debian's chromium, through Playwright (whose own browser
# download needs the internet). Installed here when missing and possible; otherwise that test skips, saying why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
	      echo "make: could not install chromium; the dashboard browser test will be skipped"; \
	  else \
	    echo "make: chromium not found and apt-get unavailable (or not root); the dashboard browser test will be skipped"; \
	  fi; \
	}

test: test-models redis compose chromium
	$(PY) -m ruff check gateway backend kernels bench tests
	SMOLGATE_QUANTIZATION=none $(PY) -m pytest -q -x --durations=15

bench: models
	$(PY) -m bench.throughput

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
