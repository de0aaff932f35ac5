"""OpenAI's Files and Batch APIs: JSONL batches run on the gateway's own request path at the engine's
lowest priority, behind live traffic, durable across restarts (docs/batches.md)."""
