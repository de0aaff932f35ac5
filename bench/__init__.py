"""Benchmarks: run each as `python -m bench.<name>`; the last line printed is one JSON object."""
