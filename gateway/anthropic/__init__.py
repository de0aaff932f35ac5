"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) at the edge of the chat pipeline.

A Messages request is translated into a Chat Completions body (request.py) and served by the same
handler as /v1/chat/completions — keys, limits, priorities, cache, routing, metrics and the access log
included; its answer (a chat.completion, or a stream's typed events) is translated back (response.py, stream.py),
and every failure is rendered in Anthropic's error shape (errors.py). docs/messages.md says what is
supported.
"""
