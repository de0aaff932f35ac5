# The engine as its own service: python -m gateway --embedded-only (the OpenAI-compatible API, embedded engine, no routing).
# The model is not baked in: compose's `models` job fetches it once into the named volume mounted at /models.
FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 SMOLGATE_CACHE=/models
# A C compiler for the engine's CPU kernels (kernels/cpu/*.c: built into /models/kernels by the `models` job or at
# the first load); without one the engine falls back to torch's ops.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backend backend
COPY kernels kernels
COPY bench bench
RUN pip install .
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --retries=30 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready')"
CMD ["python", "-m", "gateway", "--embedded-only", "--host", "0.0.0.0", "--port", "8000"]
