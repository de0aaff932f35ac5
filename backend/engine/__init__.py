"""The engine core: requests in, outputs out; scheduler, KV cache, sampling, the async wrapper."""
