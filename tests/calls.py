"""Counting the calls of a method in a test (how much work a shortcut saved)."""

from __future__ import annotations

from typing import Any

import pytest


def count_calls(patch: pytest.MonkeyPatch, owner: type, method: str) -> dict[str, int]:
    """Count the calls of ``owner.<method>`` from now on, while ``patch`` holds
    (``["count"]``, which may be reset)."""
    calls = {"count": 0}
    original = getattr(owner, method)

    def counting(self: Any, *args: Any) -> Any:
        calls["count"] += 1
        return original(self, *args)

    patch.setattr(owner, method, counting)
    return calls
