"""The ejk-triton distribution: entry point, hooks and platform status on this machine."""

from __future__ import annotations

import os
import re

import jax
import pytest

import ejk.ops
from ejk.testing import check_discovered_plugins, check_imports_lazily, check_plugin


def test_plugin_conforms() -> None:
    info, _registry = check_plugin("triton")
    assert info.distribution == "ejk-triton"
    (status,) = info.platforms
    assert status.platform == "triton"
    if jax.default_backend() == "cpu":
        assert not status.available
        assert re.match(r"no CUDA GPU \(JAX's default backend is cpu\)", status.reason or ""), status.reason
        assert status.fix and "EJK_TRITON_INTERPRET=1" in status.fix
    elif status.available:
        assert dict(status.versions).get("triton")


def test_registrations_follow_the_interpret_mode() -> None:
    _info, registry = check_plugin("triton")
    expected = {"gpu", "cpu"} if os.environ.get("EJK_TRITON_INTERPRET") == "1" else {"gpu"}
    ops = (("flash_attention", "FlashAttentionConfig"), ("flash_attention_lse", "FlashAttentionConfig"),
           ("ragged_paged_attention", "PagedAttentionConfig"), ("mla_paged_attention", "MlaAttentionConfig"),
           ("linear_cross_entropy", "LinearCrossEntropyConfig"), ("flash_attention_varlen", "VarlenAttentionConfig"),
           ("rms_norm", "RmsNormConfig"))
    for op, cfg_name in ops:
        implementations = type(ejk.ops.get_op(op).kernel)(registry).implementations()  # flash_attention_lse: derived
        assert {str(spec.backend) for spec in implementations} == expected
        (spec, *_) = [s for s in implementations if s.name != "segments"]  # segments: segment-id calls only
        assert spec.priority > 0 and spec.cfg_type is not None and spec.cfg_type.__name__ == cfg_name
    (paged, *_) = registry.list_implementations("ragged_paged_attention")
    assert paged.vjp is None and paged.capability is not None  # not differentiable, like ejk-xla's
    (mla, *_) = registry.list_implementations("mla_paged_attention")
    assert mla.vjp is None and mla.capability is not None and mla.name == "mla"


def test_expected_plugins_discovered() -> None:
    if not check_discovered_plugins():
        pytest.skip("EJK_EXPECT_PLUGINS is not set (the nox sessions set it)")


def test_plugin_module_imports_without_its_toolkit() -> None:
    check_imports_lazily("ejk_triton.plugin")
