"""Workspace-wide pytest hooks: tests marked `gpu` run only where JAX sees a GPU."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import jax

    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU; JAX's default backend here is {jax.default_backend()}")
    for item in gpu_items:
        item.add_marker(skip)
