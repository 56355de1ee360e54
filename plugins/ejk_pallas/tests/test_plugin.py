"""The ejk-pallas distribution: entry point, hooks and platform status on this machine."""

from __future__ import annotations

import jax
import pytest

from ejk.testing import check_discovered_plugins, check_imports_lazily, check_plugin


def test_plugin_conforms() -> None:
    info, _registry = check_plugin("pallas")
    assert info.distribution == "ejk-pallas"
    (status,) = info.platforms
    assert status.platform == "pallas"
    if jax.default_backend() == "cpu":
        assert not status.available
        assert "NVIDIA GPU" in (status.reason or ""), status.reason
        assert status.fix


def test_expected_plugins_discovered() -> None:
    if not check_discovered_plugins():
        pytest.skip("EJK_EXPECT_PLUGINS is not set (the nox sessions set it)")


def test_plugin_module_imports_without_its_toolkit() -> None:
    check_imports_lazily("ejk_pallas.plugin")
