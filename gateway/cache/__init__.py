"""The gateway's response cache: exact and semantic lookups, in-process or Redis stores, faithful replay.

Nothing here imports torch: query embeddings come through the `EmbeddingClient` protocol.
"""
