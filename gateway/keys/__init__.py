"""API keys: their policies (config.py) and the checks every request passes (guard.py; docs/security.md)."""
