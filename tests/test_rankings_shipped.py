"""ejk-core's shipped rankings (every device's pack) against the installed plugins: every label they name (each
half of a forward+backward pairing too) is registered for that op."""

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


SHIPPED = [(path.stem, op) for path in sorted(CORE_PACKS_DIR.glob("*.json")) for op in load_pack(str(path)).rankings]


def test_every_device_pack_is_checked() -> None:
    assert {pack for pack, _ in SHIPPED} == {"nvidia_h100", "nvidia_h200"}
    assert {op for pack, op in SHIPPED if pack == "nvidia_h100"} >= {
        "flash_attention", "flash_attention_lse", "flash_attention_varlen", "matmul", "grouped_matmul",
        "ragged_paged_attention", "linear_cross_entropy", "rms_norm", "mla_paged_attention"}


@pytest.mark.parametrize(("pack", "op"), SHIPPED)
def test_the_shipped_rankings_name_registered_implementations(registry: KernelRegistry, pack: str, op: str) -> None:
    rankings = load_pack(str(CORE_PACKS_DIR / f"{pack}.json")).rankings[op]
    kernel = type(get_op(op).kernel)(registry)  # an op variant's implementations include the derived ones
    registered = {spec.label for spec in kernel.implementations()}
    for ranking in rankings:
        named = {half for label in ranking.order for half in label.split("+")}
        assert named <= registered, f"{pack} {op}: {sorted(named - registered)} no plugin registers"
