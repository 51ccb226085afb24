"""Kueue's Configuration on a live cluster: the ConfigMap Kueue reads at start.

Kueue's manifests install its Configuration (``apiVersion: config.kueue.x-k8s.io/v1beta1`` or
``v1beta2``, ``kind: Configuration``) as the key ``controller_manager_config.yaml`` of the ConfigMap
``kueue-manager-config`` in ``kueue-system``. The controller, ``gpuplane schedule --kubeconfig`` and
``gpuplane why`` read it from there, so that what the core takes from it (fair sharing, feature
gates, ``resources.deviceClassMappings``: DRA charged against quota) applies on a live cluster as on
a state file that holds the Configuration.

:func:`read_configuration` answers the Configuration document, ready to join the objects of a cluster
state (under the cache kind :data:`CONFIG_KIND`):

* a missing ConfigMap (or key), or one these credentials may not read, is no Configuration: Kueue's
  defaults, no device class mappings;
* a malformed one (not YAML, not a Configuration, or a field the loader refuses) raises
  :class:`KueueConfigError`, one line naming the ConfigMap; callers report it and go on without it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import yaml

from gpuplane.k8s.api import CONFIG_MAPS, ApiError, KubeApi
from gpuplane.k8s.informer import Cache
from gpuplane.model.errors import InputError
from gpuplane.model.loader import state_from_objects

log = logging.getLogger(__name__)

KUEUE_NAMESPACE = "kueue-system"
KUEUE_CONFIG_MAP = "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
CONFIG_KIND = "Configuration"  # the kind the document is kept under in a cache or a listing
CONFIG_GROUP = "config.kueue.x-k8s.io"
CONFIG_VERSIONS = ("v1beta1", "v1beta2")
_FORBIDDEN = 403


class KueueConfigError(InputError):
    """A Kueue ConfigMap whose Configuration cannot be used (the message names the ConfigMap)."""


@dataclass(frozen=True)
class KueueConfigSource:
    """Where Kueue's Configuration is read from: the ConfigMap's namespace and name (empty name: not
    read at all)."""

    namespace: str = KUEUE_NAMESPACE
    name: str = KUEUE_CONFIG_MAP

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"


DEFAULT_SOURCE = KueueConfigSource()


def configuration_document(config_map: dict[str, Any], source: KueueConfigSource) -> dict[str, Any] | None:
    """The Configuration held by ``config_map`` (a ConfigMap object), checked as the loader reads it;
    ``None`` when it has no :data:`KUEUE_CONFIG_KEY`. Raises :class:`KueueConfigError`."""
    data = config_map.get("data") or {}
    text = data.get(KUEUE_CONFIG_KEY) if isinstance(data, dict) else None
    if text is None:
        return None
    where = f"{source.where} ({KUEUE_CONFIG_KEY})"
    try:
        doc = yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError as err:
        raise KueueConfigError(f"{where}: not YAML: {' '.join(str(err).split())}") from None
    if not isinstance(doc, dict):
        raise KueueConfigError(f"{where}: not a Configuration object")
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    group, _, version = str(api_version).rpartition("/")
    if kind != CONFIG_KIND or group != CONFIG_GROUP or version not in CONFIG_VERSIONS:
        wanted = " or ".join(f"{CONFIG_GROUP}/{v}" for v in CONFIG_VERSIONS)
        raise KueueConfigError(
            f"{where}: expected kind {CONFIG_KIND} of {wanted}, got kind {kind!r} of {api_version!r}"
        )
    try:
        state_from_objects([doc], source=where)
    except InputError as err:
        raise KueueConfigError(str(err)) from None  # names the ConfigMap, the field and the problem
    return doc


def read_configuration(api: KubeApi, source: KueueConfigSource = DEFAULT_SOURCE) -> dict[str, Any] | None:
    """Kueue's Configuration from its ConfigMap (module docstring): the document, or ``None`` when
    there is none to read. Raises :class:`KueueConfigError` for a malformed one, and
    :class:`ApiError` when the API server fails otherwise."""
    if not source.name:
        return None
    try:
        config_map = api.get(CONFIG_MAPS, source.name, source.namespace)
    except ApiError as err:
        if err.not_found or err.status == _FORBIDDEN:
            return None
        raise
    return configuration_document(config_map, source)


class KueueConfigReader:
    """The controller's copy of Kueue's Configuration: owns the ConfigMap's source, when it is read
    next, and the last malformed ConfigMap's error (logged once, not every read)."""

    def __init__(self, api: KubeApi, source: KueueConfigSource, period: float) -> None:
        self.api = api
        self.source = source
        self.period = period
        self.due = -math.inf  # monotonic seconds
        self.problem = ""

    def refresh(self, cache: Cache, now: float) -> None:
        """When due, read the Configuration and keep it in ``cache`` under :data:`CONFIG_KIND` (no
        object when there is none, or it is malformed). A failing API server is tried again next
        time; what the cache held stays."""
        if now < self.due:
            return
        try:
            doc = read_configuration(self.api, self.source)
            self.problem = ""
        except KueueConfigError as err:
            if str(err) != self.problem:
                log.error("ignoring Kueue's configuration: %s", err)
            self.problem = str(err)
            doc = None
        except ApiError as err:
            log.warning("cannot read Kueue's configuration from %s: %s", self.source.where, err)
            return
        self.due = now + self.period
        docs = [] if doc is None else [{**doc, "metadata": {"name": self.source.name}}]
        if docs != cache.items(CONFIG_KIND):
            cache.replace_all(CONFIG_KIND, docs)
