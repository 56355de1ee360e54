"""Workspace-wide pytest hooks: tests marked `gpu` run only where JAX sees a GPU.

Pallas's Mosaic GPU interpreter (ejk-pallas's tests on a CPU) runs each simulated warpgroup as a thread
whose barrier waits block inside host callbacks. XLA's CPU scheduler that reorders a program for
concurrency (``--xla_cpu_enable_concurrency_optimized_scheduler``) let those waits hold every worker of
a 2-core machine, so some kernels never finished (jax 0.10.2, 2026-11-26: every Mosaic GPU attention
forward whose query length was not a block multiple). This file turns that scheduler off before JAX
starts; it is a CPU compilation flag, so GPU programs are unaffected.
"""

from __future__ import annotations

import os

import pytest

_SCHEDULER_FLAG = "xla_cpu_enable_concurrency_optimized_scheduler"
if _SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{_SCHEDULER_FLAG}=false".strip()


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
