"""Speculative decoding: cheap proposals verified by the target model in one batched forward."""
