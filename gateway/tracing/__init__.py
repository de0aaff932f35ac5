"""OpenTelemetry traces of the gateway's requests (docs/tracing.md): off, and never imported past spans.py, unless an
OTLP endpoint is configured."""
