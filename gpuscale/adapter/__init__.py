"""The aggregated metrics API server (custom.metrics.k8s.io v1beta1/v1beta2, external.metrics.k8s.io v1beta1)."""
