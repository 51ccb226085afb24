"""Frozen domain types, Kubernetes object parsing and resource quantities (the bottom layer)."""
