"""The ejk-triton tests run the real kernels through Triton's interpreter on a CPU-only machine.

The interpreter must be chosen before triton is first imported, so the variable is set here
(the nox session sets it too); on a machine with a GPU the kernels run compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if "EJK_TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        import jax

        if jax.default_backend() == "cpu":
            os.environ["EJK_TRITON_INTERPRET"] = "1"


@pytest.fixture
def compile_report(tmp_path: Path) -> Callable[..., Any]:
    """Runs a script that compiles kernels as a GPU would (PTX, then a cubin with the ptxas Triton ships) in a
    process without the interpreter, on the CPU, and returns the JSON its last output line prints."""

    def run(script: str, timeout: int = 300) -> Any:
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "EJK_TRITON_INTERPRET")}
        env.update(JAX_PLATFORMS="cpu", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                timeout=timeout)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    return run
