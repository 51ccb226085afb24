"""Loading a benchmark script from ``bench/`` (not a package) as a module, for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def load_bench(script: str) -> ModuleType:
    """``bench/<script>`` as the module ``bench_<stem>``, registered in ``sys.modules`` before it
    runs (dataclasses look their module up there)."""
    path = BENCH_DIR / script
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
