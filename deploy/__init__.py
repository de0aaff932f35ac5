"""Deployment tooling: the Helm chart's offline render and validation (deploy/chart.py)."""
