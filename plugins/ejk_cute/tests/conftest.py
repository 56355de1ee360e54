"""CuTe DSL reads ``CUTE_DSL_ARCH`` when ``cutlass`` is first imported: on a CPU-only machine the
compile-path tests build the kernels for sm_90a (the nox session sets it too). Where ejk-triton is
installed too, its interpreter runs the backward that cute/gpu:fa3 pairs with (tests of the pairing)."""

from __future__ import annotations

import os
import sys

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if "CUTE_DSL_ARCH" not in os.environ and "cutlass" not in sys.modules:
        os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    if "EJK_TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        import jax

        if jax.default_backend() == "cpu":
            os.environ["EJK_TRITON_INTERPRET"] = "1"
