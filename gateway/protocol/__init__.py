"""OpenAI request bodies in (parsed and validated into typed requests), response bodies and SSE out."""
