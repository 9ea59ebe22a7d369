"""Simulated cluster for tests and the demo: Kubernetes API, DCGM and Triton exporters, load models."""
