"""A broken cache file never breaks an op (issue 14): valid JSON that does not load, deep
nesting, a user's JSON at the op's path. Runs in a fresh interpreter with the real plugins."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RunPython = Callable[..., Any]  # the run_python fixture of conftest.py

CALL = """
import json, warnings
warnings.simplefilter("ignore")
import jax.numpy as jnp
import ejk
a = jnp.ones((8, 8), jnp.float32)
out = ejk.matmul(a, a)
print(json.dumps({"ok": float(out[0, 0]) == 8.0}))
"""

BROKEN = {
    "huge-schema": json.dumps({"format": "ejk-config-cache", "schema": 1, "entries": {"cpu|cpu": {"matmul": {
        "k": {"cfg": 1, "schema": 1e400}}}}}).replace("1e+400", "1e400"),
    "empty-version-name": json.dumps({"format": "ejk-config-cache", "schema": 1, "entries": {"d": {"o": {
        "k": {"cfg": 1, "schema": 1, "provenance": {"versions": {"": "x"}}}}}}}),
    "entries-not-an-object": json.dumps({"format": "ejk-config-cache", "schema": 1, "entries": 5}),
    "deep-nesting": "[" * 100_000 + "]" * 100_000,
    "not-ours": json.dumps({"notes": "mine"}),
}


@pytest.mark.parametrize("content", list(BROKEN.values()), ids=list(BROKEN))
def test_ops_work_next_to_a_broken_cache_file(run_python: RunPython, tmp_path: Path, content: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "matmul.json").write_text(content)
    result = run_python(CALL, EJK_CACHE_DIR=str(cache), EJK_PLUGINS="xla")
    assert result == {"ok": True}
    if content == BROKEN["not-ours"]:
        assert (cache / "matmul.json").read_text() == content
