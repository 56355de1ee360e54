"""ejk-core's shipped H100 rankings against the installed plugins: every label they name is registered,
and their order is the order the tiers and priorities give without ranking data (the shipped pack
states today's measured order as data; it changes no decision)."""

from __future__ import annotations

import importlib.metadata

import pytest

from ejk.config.packs import CORE_PACKS_DIR, load_pack
from ejk.ops import get_op
from ejk.plugins import PluginHost
from ejk.registry import KernelRegistry

PLUGINS = ("cute", "pallas", "triton", "xla")


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    eps = [ep for ep in importlib.metadata.entry_points(group="ejk") if ep.name in PLUGINS]
    assert sorted(ep.name for ep in eps) == sorted(PLUGINS)
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("EJK_PLUGINS", raising=False)
        mp.delenv("EJK_DISABLE_PLUGINS", raising=False)
        host.load_entry_points(eps)
    return host.registry


@pytest.mark.parametrize("op", ["flash_attention", "flash_attention_lse", "matmul", "grouped_matmul",
                                "ragged_paged_attention"])
def test_the_h100_ranking_names_registered_implementations_in_the_default_order(
        registry: KernelRegistry, op: str) -> None:
    (ranking,) = load_pack(str(CORE_PACKS_DIR / "nvidia_h100.json")).rankings[op]
    kernel = type(get_op(op).kernel)(registry)  # an op variant's implementations include the derived ones
    default = [spec.label for spec in kernel.implementations()]
    assert set(ranking.order) <= set(default), f"{op}: labels no plugin registers"
    assert list(ranking.order) == [label for label in default if label in ranking.order]
