"""The embedded inference engine: paged KV cache, continuous batching, batched sampling."""
