"""The libyaml fast path reads exactly what the guarded pure-Python loader reads."""

from __future__ import annotations

import pytest

from gpuplane.model import loader

TEXTS = [
    pytest.param("a: 0123\nb: -5\nc: 0x1F\nd: 1_000\ne: 12\nf: true\ng: ~\nh: 1.5\n", id="scalars"),
    pytest.param("t: 2026-01-01T00:00:00Z\nd: 2026-01-01\n", id="timestamps-stay-strings"),
    pytest.param("base: {x: 1}\n<<: {z: 1}\nlist: [1, [2, 3], {}]\n", id="merge-key-and-flow"),
    pytest.param("- !!binary aGVsbG8=\n- '007'\n- \"0\"\n", id="explicit-tags-and-quotes"),
    pytest.param("a: 1\n---\n---\nb: [x, y]\n", id="several-documents"),
]


@pytest.mark.parametrize("text", TEXTS)
def test_fast_path_agrees_with_the_guarded_loader(text: str) -> None:
    assert loader._shallow(text)

    fast = loader._yaml_documents(text)
    guarded = list(loader.yaml.load_all(text, Loader=loader._GuardedLoader))

    assert fast == guarded


def test_deep_or_aliased_text_takes_the_guarded_path() -> None:
    assert not loader._shallow("x: " + "[" * 2000 + "]" * 2000)
    assert not loader._shallow("- " * 1000 + "x\n")
    assert loader._yaml_documents("a: &x [1]\nb: *x\n") == [{"a": [1], "b": [1]}]
