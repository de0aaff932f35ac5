"""Sentence embeddings (all-MiniLM-L6-v2 and other BERT encoders)."""
