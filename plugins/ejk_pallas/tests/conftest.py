"""ejk-pallas's tests run its GPU kernels in Pallas's interpret mode on a CPU-only machine.

The nox session sets ``EJK_PALLAS_INTERPRET=1``; so does this file when it is unset and JAX's
backend is the CPU. On a machine with an NVIDIA GPU the kernels run compiled.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if "EJK_PALLAS_INTERPRET" not in os.environ:
        import jax

        if jax.default_backend() == "cpu":
            os.environ["EJK_PALLAS_INTERPRET"] = "1"
