"""Routing: a request's model (alias, `auto`, fallbacks) -> a deployment -> an upstream, with retries."""
