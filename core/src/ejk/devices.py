"""Facts about JAX's default device that GPU plugins' gates and configs read.

Every function answers without a GPU too (a reason, ``None``, or Hopper's numbers where a number is
needed: ahead-of-time lowering and the interpreters on a CPU configure for an H100), and none
imports a toolkit. Functions look each other up through this module, so a test may replace
:func:`nvidia_gpu` or :func:`default_device` here to describe another device.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "HOPPER_SMEM_BYTES",
    "HOPPER_SMS",
    "SMEM_KIB",
    "compute_capability",
    "default_device",
    "nvidia_gpu",
    "sm_count",
    "smem_per_block",
]

#: Streaming multiprocessors of an H100 SXM: the SM count where there is no GPU to ask.
HOPPER_SMS = 132
#: Shared memory one block may opt into on sm_90 (bytes): the budget where there is no GPU to ask.
HOPPER_SMEM_BYTES = 227 * 1024
#: Shared memory a block may opt into (KiB) by compute capability; other NVIDIA GPUs: 99 KiB.
SMEM_KIB = {(8, 0): 163, (8, 7): 163, (9, 0): 227, (10, 0): 227, (10, 3): 227}
_OTHER_SMEM_KIB = 99


def default_device() -> Any:
    """JAX's first default device."""
    import jax

    return jax.devices()[0]


@functools.cache
def nvidia_gpu() -> tuple[bool, str]:
    """``(True, device kind)`` when JAX's default device is an NVIDIA GPU, else ``(False, why)``."""
    import jax

    backend = jax.default_backend()
    if backend not in ("gpu", "cuda"):
        return False, f"JAX's default backend is {backend}"
    device = default_device()
    kind = str(getattr(device, "device_kind", ""))
    version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
    if "rocm" in version or "hip" in version:
        return False, f"the GPU is not an NVIDIA GPU ({kind or version})"
    return True, kind


def compute_capability() -> tuple[int, int] | None:
    """``(major, minor)`` of JAX's default device when it is an NVIDIA GPU that reports one, else ``None``."""
    if not nvidia_gpu()[0]:
        return None
    raw = str(getattr(default_device(), "compute_capability", "") or "")
    try:
        major, minor = (int(x) for x in raw.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def sm_count() -> int:
    """Streaming multiprocessors of this machine's NVIDIA GPU; :data:`HOPPER_SMS` when there is none or it
    does not say."""
    if not nvidia_gpu()[0]:
        return HOPPER_SMS
    count = getattr(default_device(), "core_count", None)
    return int(count) if isinstance(count, int) and count > 0 else HOPPER_SMS


def smem_per_block() -> int:
    """Shared memory (bytes) one block may opt into on this machine's NVIDIA GPU, by its compute capability
    (:data:`SMEM_KIB`, 99 KiB for others); :data:`HOPPER_SMEM_BYTES` when there is no GPU or it does not say."""
    found = compute_capability()
    if found is None:
        return HOPPER_SMEM_BYTES
    return SMEM_KIB.get(found, _OTHER_SMEM_KIB) * 1024
