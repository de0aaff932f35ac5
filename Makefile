# Two commands do everything: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: serve test install models test-models lint bench clean system-deps clients chart matcher

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

models: install
	$(PY) -m backend.fetch
	$(PY) -m gateway.cache.wordnet_fetch

# The tests run the full-precision model (greedy output is checked against HF's fp32 reference), the GGUF's 4-bit
# blocks `make serve` serves (checked against the same weights dequantized) and the quantizer on real layers; no AWQ copy;
# and Gemma 3 270M's Q4_K_M GGUF (a second architecture, checked against HF on the same weights).
test-models: install
	$(PY) -m backend.fetch --copies auto,none --gemma
	$(PY) -m gateway.cache.wordnet_fetch

# The semantic cache's learned matcher ships trained (gateway/cache/matcher.json, and MiniLM's fine-tuned top layers in
# matcher_encoder.safetensors); this fine-tunes, retrains and recalibrates both from the tuning pair files (about ten
# minutes on 2 cores).
matcher: models
	$(PY) -m gateway.cache.train

serve: models
	$(PY) -m gateway --host $(HOST) --port $(PORT)

# System tools some tests need, Debian packages installed here when missing and possible (root + apt-get);
# otherwise the tests that need them skip, saying why:
#   redis-server    the Redis cache, shared rate limits and the multi-replica topology tests
#   postgresql      the spend ledger on PostgreSQL (tests/test_spend_durability.py starts its own `postgres`)
#   docker-compose  `docker compose config` of compose.yaml (when the docker client has no compose plugin;
#                   no Docker engine is needed to validate)
#   chromium        the dashboard test (Playwright drives the system browser: its own download needs internet)
#   gcc-aarch64-linux-gnu, qemu-user   the NEON kernels' test: cross-compiled for aarch64, run under qemu-aarch64
#                   (not on an aarch64 host, where the test builds with cc and runs natively)
#   nodejs, npm     installs Claude Code and Codex CLI (`make clients`) for tests/test_clients_cli.py
system-deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || missing="$$missing postgresql"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	{ docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } || missing="$$missing docker-compose"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ "$$(uname -m)" != aarch64 ]; then \
	  command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing="$$missing gcc-aarch64-linux-gnu"; \
	  command -v qemu-aarch64 >/dev/null 2>&1 || missing="$$missing qemu-user"; \
	fi; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ]; then \
	  echo "make: missing$$missing and apt-get unavailable (or not root); the tests needing them will be skipped"; exit 0; \
	fi; \
	apt-get update -qq || true; \
	for pkg in $$missing; do \
	  apt-get install -y -qq $$pkg >/dev/null || echo "make: could not install $$pkg; the tests needing it will be skipped"; \
	done

# The coding-agent CLIs tests/test_clients_cli.py runs against a live gateway, at pinned versions, into .clients/
# (git ignores it). Without npm or the registry the install is skipped, and so are those tests, saying why.
CLIENTS := .clients
CLAUDE_CODE_VERSION := 2.1.328
CODEX_VERSION := 0.169.0
CLIENTS_STAMP := $(CLIENTS)/.installed-$(CLAUDE_CODE_VERSION)-$(CODEX_VERSION)
$(CLIENTS_STAMP):
	@if ! command -v npm >/dev/null 2>&1; then echo "make: npm missing: the coding-agent CLI tests will be skipped"; exit 0; fi; \
	mkdir -p $(CLIENTS) && cd $(CLIENTS) && \
	if npm install --no-audit --no-fund --no-save --prefix . @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) \
	     @openai/codex@$(CODEX_VERSION) >npm-install.log 2>&1; then touch ../$(CLIENTS_STAMP); \
	else echo "make: npm install of the coding-agent CLIs failed (see $(CLIENTS)/npm-install.log): their tests will be skipped"; fi
clients: system-deps $(CLIENTS_STAMP)

# The Helm chart rendered offline for every shipped value set (deploy/helm/smolgate/examples/*.yaml) into
# build/chart/<name>.yaml, every document validated against the Kubernetes schemas and the vendored CRDs
# (deploy/chart.py says how; docs/deployment.md how to install it).
chart: install
	$(PY) -m deploy.chart

test: test-models system-deps clients chart
	$(PY) -m ruff check gateway backend kernels bench tests deploy
	$(PY) -m mypy
	$(PY) -m vulture  # dead code (pyproject.toml's [tool.vulture]: paths, confidence, framework names)
	@# llama.cpp's HF-to-GGUF converter (llama-cpp-python's pinned source package, via pip): tests/test_phi3_gguf.py
	@# writes Phi-3 GGUF files with it; without the registry those tests skip, saying why
	src=$$($(PY) -m bench.llama_cpp_src) || { echo "make: llama.cpp's converter could not be fetched: its tests skip"; src=""; }; \
	SMOLGATE_LLAMA_CPP="$$src" SMOLGATE_QUANTIZATION=none $(PY) -m pytest -q -x --durations=15

# The benchmark suite (bench/suite.py), then the tables in docs/benchmarks.md and README.md and the plots in
# bench/plots/, all regenerated from bench/results/*.json (docs/benchmarks.md says what each bench measures).
#   make bench BENCH_QUICK=1                          a smoke run: every bench on a tiny workload
#   make bench LLAMA_SERVER=/path/to/llama-server     llama.cpp's server measured in the same run (PEER_URL=URL: any
#                                                     running OpenAI-compatible server); otherwise reported absent
#   make bench BENCH_ONLY=throughput,cache BENCH_SKIP=soak BENCH_TIMEOUT=600 BENCH_QUANTIZATION=none
BENCH_ARGS = $(if $(BENCH_QUICK),--quick) $(if $(BENCH_ONLY),--only $(BENCH_ONLY)) $(if $(BENCH_SKIP),--skip $(BENCH_SKIP)) \
	$(if $(BENCH_TIMEOUT),--timeout $(BENCH_TIMEOUT)) $(if $(BENCH_QUANTIZATION),--quantization $(BENCH_QUANTIZATION)) \
	$(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER)) $(if $(PEER_URL),--peer-url $(PEER_URL))
bench: models
	$(PY) -m bench.suite $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache $(CLIENTS)
