"""What operators read: Prometheus metrics, live stats and the dashboard's page (static/; api/dashboard.py serves
it), the access log, request records."""
