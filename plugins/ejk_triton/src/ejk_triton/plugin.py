"""The ``triton`` entry point. Needs triton and jax-triton and a CUDA GPU; imports neither here."""

from __future__ import annotations

from typing import Any

import ejk
from ejk.plugins import probe_platform


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return probe_platform("triton", requires={"triton": "triton", "jax_triton": "jax-triton"}, backends=("gpu",))


@ejk.hookimpl
def ejk_device_fingerprint(device: Any) -> dict[str, str] | None:
    capability = getattr(device, "compute_capability", None)
    return {"cc": str(capability)} if capability else None
