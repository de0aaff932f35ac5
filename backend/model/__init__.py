"""Model implementations. Only the Llama family (Llama, SmolLM, Qwen2, Mistral) for now."""
