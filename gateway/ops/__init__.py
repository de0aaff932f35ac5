"""What operators read: Prometheus metrics, live stats and the dashboard, the access log, request records."""
