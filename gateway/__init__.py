"""The OpenAI-compatible HTTP gateway (Starlette). It never imports torch."""
