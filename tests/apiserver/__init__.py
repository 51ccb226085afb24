"""A Kubernetes API-server double for tests: the real HTTP API on loopback, with fault injection.

Start one with the ``apiserver`` fixture (see :mod:`.fixtures`) or by hand::

    with ApiServerDouble() as double:
        double.write_kubeconfig(tmp_path / "kubeconfig")
        ...  # kubectl --kubeconfig ..., or kubernetes.config.new_client_from_config(...)
        double.faults.conflict(times=2, resource="pods")
        assert double.requests.bindings() == [("default", "p", "n1")]

It is a test fixture, not a product path: it implements the API semantics tests rely on (see
``server``, ``store`` and ``strategies`` for what exactly) and nothing else.
"""

from .crds import custom_resource_definition, job_framework_crds, kueue_crds
from .errors import ApiError
from .faults import Exchange, Faults, Request, RequestLog, Rule
from .server import ApiServerDouble
from .store import Store, VirtualClock, WatchEvent

__all__ = [
    "ApiError",
    "ApiServerDouble",
    "Exchange",
    "Faults",
    "Request",
    "RequestLog",
    "Rule",
    "Store",
    "VirtualClock",
    "WatchEvent",
    "custom_resource_definition",
    "job_framework_crds",
    "kueue_crds",
]
