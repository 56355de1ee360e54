"""The ejk-cute tests compile the CuTe kernels for Hopper on a CPU-only machine (``jax.export`` for CUDA).

The DSL reads its target architecture when CUTLASS is first imported; without a GPU it has none
to ask, so ``CUTE_DSL_ARCH=sm_90a`` is set here (the nox session sets it too).
"""

from __future__ import annotations

import os
import sys

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if "CUTE_DSL_ARCH" not in os.environ and "cutlass" not in sys.modules:
        import jax

        if jax.default_backend() == "cpu":
            os.environ["CUTE_DSL_ARCH"] = "sm_90a"
