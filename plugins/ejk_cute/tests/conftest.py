"""The ejk-cute tests compile the CuTe kernels for Hopper on a CPU-only machine (``jax.export`` for CUDA).

The DSL reads its target architecture when CUTLASS is first imported; without a GPU it has none
to ask, so ``CUTE_DSL_ARCH=sm_90a`` is set here (the nox session sets it too). Where ejk-triton is
installed too, its interpreter runs the backward that cute/gpu:fa3 pairs with on a CPU (tests of
the pairing), so ``EJK_TRITON_INTERPRET=1`` is set as ejk-triton's own tests do.
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
    if "EJK_TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        import jax

        if jax.default_backend() == "cpu":
            os.environ["EJK_TRITON_INTERPRET"] = "1"
