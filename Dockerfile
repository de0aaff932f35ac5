FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 SMOLGATE_CACHE=/models
# A C compiler for the engine's CPU kernels (kernels/cpu/*.c, built by `backend.fetch` below); without one the
# engine falls back to torch's ops.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
# torch comes from PyPI with `pip install .` below (its Linux wheel carries CUDA libraries, so the
# same image uses a GPU when one is passed through, and the CPU otherwise).
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backend backend
COPY kernels kernels
COPY bench bench
RUN pip install .
# Models are fetched (and the CPU kernels compiled) at build time, so the container runs offline.
RUN python -m backend.fetch && python -m gateway.cache.wordnet_fetch
EXPOSE 8000
CMD ["python", "-m", "gateway", "--host", "0.0.0.0", "--port", "8000"]
