"""ejk-core on its own: no plugin is discovered, and the operations say what to install."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import ejk
from ejk.ops import MatmulKernel
from ejk.registry import KernelRegistry
from ejk.testing import check_discovered_plugins


def test_no_plugin_is_discovered_when_core_is_alone() -> None:
    if not check_discovered_plugins():
        pytest.skip("EJK_EXPECT_NO_PLUGINS is not set (the nox session tests_core sets it)")


def test_an_op_without_implementations_says_what_to_install() -> None:
    kernel = MatmulKernel(KernelRegistry())
    executor = ejk.Executor(ejk.ConfigSelectorChain(persist=False, plugin_host=False))
    with pytest.raises(ejk.KernelNotFoundError, match="pip install ejk-xla"):
        executor(kernel, jnp.ones((2, 3)), jnp.ones((3, 4)), platform="auto")


def test_op_input_is_validated_before_dispatch() -> None:
    with pytest.raises(ValueError, match=r"matmul: b"):
        ejk.matmul(jnp.ones((2, 3)), jnp.ones((4, 5)))
