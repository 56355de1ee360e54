"""The ejk-triton tests run the real kernels through Triton's interpreter on a CPU-only machine.

The interpreter must be chosen before triton is first imported, so the variable is set here
(the nox session sets it too); on a machine with a GPU the kernels run compiled.
"""

from __future__ import annotations

import os
import sys

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if "EJK_TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        import jax

        if jax.default_backend() == "cpu":
            os.environ["EJK_TRITON_INTERPRET"] = "1"
