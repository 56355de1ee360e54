"""The ejk-xla distribution: entry point, hooks, registrations and platform status."""

from __future__ import annotations

import pytest

from ejk.plugin import Backend, Platform
from ejk.testing import check_discovered_plugins, check_imports_lazily, check_plugin
from ejk_xla import (
    FlashAttentionConfig,
    GatedDeltaRuleConfig,
    GlaConfig,
    GroupedMatmulConfig,
    LinearCrossEntropyConfig,
    MatmulConfig,
    MlaAttentionConfig,
    PagedAttentionConfig,
    RmsNormConfig,
    SsdConfig,
    VarlenAttentionConfig,
)
from ejk_xla._lce_grad_in_forward import GradInForwardConfig


def test_plugin_conforms_and_registers_every_op() -> None:
    info, registry = check_plugin("xla")
    assert info.distribution == "ejk-xla"
    (status,) = info.platforms
    assert status.available and dict(status.versions)["jax"]
    expected = {
        "flash_attention": FlashAttentionConfig,
        "flash_attention_lse": FlashAttentionConfig,
        "flash_attention_varlen": VarlenAttentionConfig,
        "matmul": MatmulConfig,
        "grouped_matmul": GroupedMatmulConfig,
        "ragged_paged_attention": PagedAttentionConfig,
        "mla_paged_attention": MlaAttentionConfig,
        "gated_delta_rule": GatedDeltaRuleConfig,
        "linear_cross_entropy": LinearCrossEntropyConfig,
        "rms_norm": RmsNormConfig,
        "gla": GlaConfig,
        "ssd": SsdConfig,
    }
    assert registry.list_algorithms() == sorted(expected)
    names = {"flash_attention": "chunked", "flash_attention_lse": "chunked", "matmul": "dot", "grouped_matmul": "tiled",
             "ragged_paged_attention": "paged", "mla_paged_attention": "paged", "gated_delta_rule": "chunked",
             "linear_cross_entropy": "chunked", "rms_norm": "fused", "gla": "chunked", "ssd": "chunked",
             "flash_attention_varlen": "chunked"}
    for algorithm, cfg_type in expected.items():
        (spec,) = [s for s in registry.list_implementations(algorithm)
                   if s.backend == Backend.ANY and s.name not in ("grad_in_forward", "composed")]
        assert (spec.platform, spec.backend, spec.cfg_type) == (Platform.XLA, Backend.ANY, cfg_type)
        assert spec.name == names[algorithm] and spec.config_space is not None and spec.heuristic is not None
    chunked, gif = registry.list_implementations("linear_cross_entropy")
    assert (chunked.name, gif.name, gif.cfg_type) == ("chunked", "grad_in_forward", GradInForwardConfig)
    assert gif.vjp is not None and gif.vjp.residuals != chunked.vjp.residuals  # its own residuals: never paired
    (composed,) = [s for s in registry.list_implementations("grouped_matmul") if s.name == "composed"]
    assert composed.cfg_type is None and composed.capability is not None  # gated calls, by auto's plain choice
    (cudnn,) = [s for s in registry.list_implementations("flash_attention") if s.backend == Backend.GPU]
    assert (cudnn.platform, cudnn.name, cudnn.cfg_type) == (Platform.XLA, "cudnn", None)
    assert cudnn.capability is not None and cudnn.priority > 0


def test_expected_plugins_discovered() -> None:
    if not check_discovered_plugins():
        pytest.skip("EJK_EXPECT_PLUGINS is not set (the nox sessions set it)")


def test_plugin_module_imports_without_heavy_toolkits() -> None:
    check_imports_lazily("ejk_xla.plugin")
