"""OpenAI's Responses API (/v1/responses) as a thin translator over the chat-completions pipeline.

A Responses request becomes a chat-completions body (request.py, items.py) that runs through the same
handler, router, cache, limits, metrics and access log as /v1/chat/completions (bridge.py); its
chat.completion (or chunk stream) becomes a Response object (or the Responses event stream) in
builder.py. Stored responses (store.py) live in process or in the gateway's Redis, per API key.
"""
