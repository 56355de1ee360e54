"""The ``cute`` entry point: registers the CuTe DSL implementations with their configs, gates and VJPs.

Imports neither CUTLASS nor a GPU runtime: the kernels import CUTLASS when they are first traced
(``_compile.import_cutlass``), and every gate starts with ``_status.runtime_reason`` (CUTLASS
installed, an sm_90+ GPU), so the plugin loads everywhere and never crashes a call it cannot run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ejk
from ejk_cute import _status

#: Compute capability the kernels need (wgmma, TMA, clusters); see ``_device``.
MIN_COMPUTE_CAPABILITY = (9, 0)


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    """Registers only the implementations that have kernels (GPU backend only)."""
    del register


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return _status.platform_status()  # type: ignore[no-any-return]


@ejk.hookimpl
def ejk_device_fingerprint(device: Any) -> dict[str, str] | None:
    capability = getattr(device, "compute_capability", None)
    return {"cc": str(capability)} if capability else None
