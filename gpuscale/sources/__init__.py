"""Sources: the only place gpuscale does I/O to the outside world (exporters, Prometheus, Kubernetes)."""
