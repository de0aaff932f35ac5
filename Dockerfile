FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 SMOLGATE_CACHE=/models
# The CPU build of torch (the default index would pull a multi-GB CUDA build).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backend backend
COPY kernels kernels
COPY bench bench
RUN pip install .
# Models are fetched at build time, so the container runs offline.
RUN python -m backend.fetch
EXPOSE 8000
CMD ["python", "-m", "gateway", "--host", "0.0.0.0", "--port", "8000"]
