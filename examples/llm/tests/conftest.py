"""The example's tests: eight CPU devices for the sharded checks, and the package from this checkout.

XLA reads the device count when JAX starts, so it is set here, before any test module imports jax.
"""

from __future__ import annotations

import os
import pathlib
import sys

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()

_SRC = str(pathlib.Path(__file__).resolve().parents[1] / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
