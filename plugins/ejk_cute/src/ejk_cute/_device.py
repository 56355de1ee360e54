"""Facts about this machine's GPU that the CuTe kernels' gates and configs read.

Every function answers without a GPU (and without CUTLASS): Hopper's values where a number is
needed (ahead-of-time lowering on the CPU compiles for sm_90a), a reason where a gate asks.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "HOPPER_SMEM_BYTES",
    "HOPPER_SMS",
    "MIN_COMPUTE_CAPABILITY",
    "arch_reason",
    "compute_capability",
    "nvidia_gpu",
    "sm_count",
    "smem_capacity",
]

#: The kernels use wgmma, TMA and thread-block clusters: Hopper (sm_90) and newer.
MIN_COMPUTE_CAPABILITY = (9, 0)
#: Shared memory one block may opt into on sm_90 (bytes), the configs' budget without a GPU.
HOPPER_SMEM_BYTES = 227 * 1024
#: Streaming multiprocessors of an H100 SXM: the persistent grid without a GPU.
HOPPER_SMS = 132


def _device() -> Any:
    import jax

    return jax.devices()[0]


@functools.cache
def nvidia_gpu() -> tuple[bool, str]:
    """``(True, device kind)`` when JAX's default device is an NVIDIA GPU, else ``(False, why)``."""
    import jax

    backend = jax.default_backend()
    if backend not in ("gpu", "cuda"):
        return False, f"JAX's default backend is {backend}"
    device = _device()
    kind = str(getattr(device, "device_kind", ""))
    version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
    if "rocm" in version or "hip" in version:
        return False, f"the GPU is not an NVIDIA GPU ({kind or version})"
    return True, kind


def compute_capability() -> tuple[int, int] | None:
    """``(major, minor)`` of JAX's default device when it is an NVIDIA GPU that reports one, else ``None``."""
    if not nvidia_gpu()[0]:
        return None
    raw = str(getattr(_device(), "compute_capability", "") or "")
    try:
        major, minor = (int(x) for x in raw.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def arch_reason() -> str | None:
    """Why the kernels cannot run on this machine's device (no NVIDIA GPU, or one older than sm_90), else ``None``."""
    on_gpu, why = nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU of compute capability 9.0+ (sm_90; {why})"
    found = compute_capability()
    if found is None:
        return "needs sm_90+: the GPU does not report its compute capability"
    if found < MIN_COMPUTE_CAPABILITY:
        return f"needs sm_90+ (Hopper or newer): this GPU is sm_{found[0]}{found[1]}"
    return None


def sm_count() -> int:
    """Streaming multiprocessors of this machine's GPU; an H100's 132 when there is none or it does not say."""
    if not nvidia_gpu()[0]:
        return HOPPER_SMS
    count = getattr(_device(), "core_count", None)
    return int(count) if isinstance(count, int) and count > 0 else HOPPER_SMS


def smem_capacity() -> int:
    """Shared memory one block may use (bytes): sm_90's 227 KiB (also sm_100's); without a GPU, sm_90's."""
    return HOPPER_SMEM_BYTES
