# The router: python -m gateway with a `models` section and no deployment of kind embedded. No torch: it installs
# the gateway's own dependencies only (docker/gateway-requirements.txt) and the project without its dependencies.
FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 SMOLGATE_CACHE=/models
COPY docker/gateway-requirements.txt ./
RUN pip install -r gateway-requirements.txt
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backend backend
COPY kernels kernels
COPY bench bench
RUN pip install --no-deps . && python -c "import sys, gateway.__main__; assert 'torch' not in sys.modules"
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --retries=12 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready')"
CMD ["python", "-m", "gateway", "--host", "0.0.0.0", "--port", "8000"]
