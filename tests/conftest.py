"""Shared pytest configuration: fixtures of the API-server double (see apiserver/fixtures.py), the real
control plane (realkube.py), a real Prometheus (prometheus.py) and the controller's end-to-end harness
(controller_harness.py: the webhook registered with a real API server)."""

pytest_plugins = ["apiserver.fixtures", "realkube", "prometheus", "controller_harness"]
