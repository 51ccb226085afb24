"""Shared pytest configuration: fixtures of the API-server double (see apiserver/fixtures.py), the real
control plane (realkube.py) and a real Prometheus (prometheus.py)."""

pytest_plugins = ["apiserver.fixtures", "realkube", "prometheus"]
