"""Shared pytest configuration: fixtures of the API-server double (see apiserver/fixtures.py)."""

pytest_plugins = ["apiserver.fixtures"]
