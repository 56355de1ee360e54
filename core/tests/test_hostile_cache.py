"""Hostile op ids, import files and shared directories (issue 28): the persistent cache never
writes outside ``EJK_CACHE_DIR``, one bad entry never costs the good ones, and files written
for others stay readable by them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import jax
import pytest

from ejk import ConfigSelectorChain, Invocation, Kernel, KernelRegistry

DEV, OP = "cpu|cpu", "op@1"


@attrs.frozen
class Cfg:
    tile: int = 1


def _kernel_named(op_id: str) -> Kernel[Cfg, Any]:
    class Named(Kernel[Cfg, jax.Array]):
        cfg_type = Cfg

        def run(self, x: jax.Array, *, cfg: Cfg) -> jax.Array:  # type: ignore[override]
            return x

        def heuristic_cfg(self, inv: Invocation[Cfg]) -> Cfg:
            return Cfg()

    Named.op_id = op_id
    return Named()


@pytest.mark.parametrize("op_id", ["{outside}/evil.json", "../evil.json", "a\\..\\evil.json"])
def test_an_op_id_that_looks_like_a_path_stays_in_the_cache_dir(tmp_path: Path, op_id: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    op_id = op_id.format(outside=outside)
    cache = ConfigSelectorChain[Cfg]().persistent_cache(_kernel_named(op_id))
    assert cache is not None
    cache.put(DEV, OP, "k", {"tile": 2})
    assert os.path.dirname(cache.path) == os.environ["EJK_CACHE_DIR"]
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("algorithm", ["/tmp/evil.json", "team/x", "a\\b", "..", "nul\0byte", "tab\there"])
def test_registration_refuses_algorithm_names_that_are_paths(algorithm: str) -> None:
    with pytest.raises(ValueError, match="algorithm"):
        KernelRegistry().register(algorithm, "xla", "any")(lambda x: x)
