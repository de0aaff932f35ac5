"""OpenAI's Responses API (/v1/responses) as a thin translator over the chat-completions pipeline.

- request.py: the request body -> a validated ResponsesRequest (400s naming the field) -> a chat body
- items.py: input items (messages, function calls, their outputs) <-> stored items and chat messages
- builder.py: the chat answer's events (gateway/protocol/events.py) -> the Response object and its stream events
  (one state machine for both)
- store.py: stored responses per API key, in process or in the gateway's Redis, with a TTL
- tokens.py: input token counts and `truncation: "auto"`
- api.py: the routes

A Responses request runs through the same handler, router, cache, limits, metrics and access log as
/v1/chat/completions; nothing of the chat pipeline is copied here.
"""
