"""The ``cute`` entry point. Needs nvidia-cutlass-dsl and an sm_90+ GPU; imports neither here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ejk
from ejk.plugins import probe_platform
from ejk_cute._flash_attention import register_flash_attention

MIN_COMPUTE_CAPABILITY = (9, 0)


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    register_flash_attention(register)


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    status = probe_platform("cute", requires={"cutlass": "nvidia-cutlass-dsl"}, backends=("gpu",))
    if not status.available:
        return status
    import jax

    capability = str(getattr(jax.devices()[0], "compute_capability", "0.0"))
    major, _, minor = capability.partition(".")
    if (int(major or 0), int(minor or 0)) < MIN_COMPUTE_CAPABILITY:
        return ejk.PlatformStatus(platform="cute", available=False, versions=dict(status.versions),
                                  reason=f"CuTe kernels need compute capability >= 9.0, this GPU has {capability}",
                                  fix="run on an NVIDIA Hopper (H100/H200) or newer GPU")
    return status
