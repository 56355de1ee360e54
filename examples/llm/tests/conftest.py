"""The example's tests: XLA's flags, and the package from this checkout.

XLA reads its flags when JAX starts, so they are set here, before any test module imports jax: eight
CPU devices for the sharded checks, and XLA's CPU backend optimisations off (the programs compile in
about two thirds of the time; these tests compare results, not speed).
"""

from __future__ import annotations

import os
import pathlib
import sys

for _flag, _value in (("--xla_force_host_platform_device_count", "8"), ("--xla_backend_optimization_level", "0")):
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={_value}".strip()

_SRC = str(pathlib.Path(__file__).resolve().parents[1] / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
