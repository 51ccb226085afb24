"""Least privilege, checked: what deploy/ grants each ServiceAccount against what it used.

``granted()`` reads every Role and ClusterRole in the manifests (deploy/ and deploy/reaper/) and
the bindings that give them to gpuplane's ServiceAccounts, as (API group, resource[/subresource],
verb) per account. ``used()`` reads the API server's audit log (scripts/kube-up.sh writes one,
Metadata level, for gpuplane's accounts only). ``unused()`` is what was granted and never used,
less the pairs a role documents in its annotation :data:`KEPT_ANNOTATION`, one line per reason::

    VERB[,VERB...] RESOURCE[/SUBRESOURCE][.GROUP][,RESOURCE...]: why it is kept though no scenario uses it
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
MANIFESTS = (
    DEPLOY / "controller.yaml",
    DEPLOY / "rbac.yaml",
    DEPLOY / "webhook.yaml",
    DEPLOY / "reaper" / "reaper.yaml",
    DEPLOY / "web" / "web.yaml",
)
NAMESPACE = "gpuplane-system"
KEPT_ANNOTATION = "gpuplane.dev/kept-unused"
ROLE_KINDS = ("Role", "ClusterRole")

Pair = tuple[str, str, str]  # (API group, resource[/subresource], verb)
Doc = dict[str, Any]


def documents(paths: Iterable[Path] = MANIFESTS) -> list[Doc]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def account(name: str) -> str:
    """The audit log's user name of ServiceAccount ``name`` in gpuplane's namespace."""
    return f"system:serviceaccount:{NAMESPACE}:{name}"


def _rule_pairs(rules: list[Doc]) -> set[Pair]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }


def parse_pairs(text: str) -> set[Pair]:
    """``VERB[,VERB] RESOURCE[/SUB][.GROUP][,...]`` -> {(group, resource, verb)}; raises ValueError."""
    verbs, _, targets = text.strip().partition(" ")
    if not verbs or not targets or " " in targets.strip():
        raise ValueError(f"{text!r}: expected 'VERB[,VERB] RESOURCE[/SUBRESOURCE][.GROUP][,...]'")
    out = set()
    for target in targets.strip().split(","):
        resource, _, group = target.partition(".")
        out |= {(group, resource, verb) for verb in verbs.split(",")}
    return out


def kept(role: Doc) -> dict[Pair, str]:
    """The pairs a role documents as kept though unused, with the reason given."""
    text = ((role.get("metadata") or {}).get("annotations") or {}).get(KEPT_ANNOTATION, "")
    out: dict[Pair, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        pair, sep, reason = line.partition(":")
        if not sep or not reason.strip():
            raise ValueError(f"{role['metadata']['name']}: {line!r} gives no reason after ':'")
        out.update(dict.fromkeys(parse_pairs(pair), reason.strip()))
    return out


def granted(docs: list[Doc]) -> dict[str, tuple[set[Pair], dict[Pair, str]]]:
    """Per audit user name: the pairs its bindings grant, and those documented as kept unused."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ROLE_KINDS}
    out: dict[str, tuple[set[Pair], dict[Pair, str]]] = {}
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            if subject["kind"] != "ServiceAccount":
                continue
            pairs, documented = out.setdefault(account(subject["name"]), (set(), {}))
            pairs |= _rule_pairs(role["rules"])
            documented.update(kept(role))
    return out


def used(lines: Iterable[str]) -> dict[str, dict[Pair, set[int]]]:
    """Per audit user name: each pair it asked for, with the HTTP codes it was answered."""
    out: dict[str, dict[Pair, set[int]]] = {}
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        ref = event.get("objectRef")
        if not ref or not ref.get("resource"):
            continue  # discovery and other non-resource requests
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        pair = (ref.get("apiGroup") or "", resource, event["verb"])
        code = int((event.get("responseStatus") or {}).get("code") or 0)
        out.setdefault(event["user"]["username"], {}).setdefault(pair, set()).add(code)
    return out


def forbidden(calls: dict[Pair, set[int]]) -> set[Pair]:
    return {pair for pair, codes in calls.items() if 403 in codes}


def unused(grants: set[Pair], documented: dict[Pair, str], calls: dict[Pair, set[int]]) -> set[Pair]:
    """Granted, never used, not documented as kept."""
    return {pair for pair in grants if pair not in calls and pair not in documented}


def format_pairs(pairs: Iterable[Pair]) -> str:
    return ", ".join(f"{v} {r}{'.' + g if g else ''}" for g, r, v in sorted(pairs))
