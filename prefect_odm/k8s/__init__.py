"""Kubernetes manifests and the Prefect work-pool job template (templates as package data)."""
