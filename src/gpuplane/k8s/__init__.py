"""Kubernetes driver: builds snapshots from the API server and carries out plans against it."""
