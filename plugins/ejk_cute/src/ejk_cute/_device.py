"""Facts about this machine's GPU that the CuTe kernels' gates and configs read.

The facts are ejk's (:data:`ejk.plugin.devices`), under the names the kernels use; this module adds
ejk-cute's rule (Hopper or newer) and shared-memory budget. Every function answers without a GPU
(and without CUTLASS): Hopper's values where a number is needed (ahead-of-time lowering on the CPU
compiles for sm_90a), a reason where a gate asks.
"""

from __future__ import annotations

from ejk.plugin import devices

__all__ = [
    "HOPPER_SMEM_BYTES",
    "HOPPER_SMS",
    "MIN_COMPUTE_CAPABILITY",
    "arch_reason",
    "compute_capability",
    "sm_count",
    "smem_capacity",
]

#: The kernels use wgmma, TMA and thread-block clusters: Hopper (sm_90) and newer.
MIN_COMPUTE_CAPABILITY = (9, 0)
HOPPER_SMEM_BYTES = devices.HOPPER_SMEM_BYTES
HOPPER_SMS = devices.HOPPER_SMS
compute_capability = devices.compute_capability
sm_count = devices.sm_count


def arch_reason() -> str | None:
    """Why the kernels cannot run on this machine's device (no NVIDIA GPU, or one older than sm_90), else ``None``."""
    on_gpu, why = devices.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU of compute capability 9.0+ (sm_90; {why})"
    found = compute_capability()
    if found is None:
        return "needs sm_90+: the GPU does not report its compute capability"
    if found < MIN_COMPUTE_CAPABILITY:
        return f"needs sm_90+ (Hopper or newer): this GPU is sm_{found[0]}{found[1]}"
    return None


def smem_capacity() -> int:
    """Shared memory one block may use (bytes): sm_90's 227 KiB (also sm_100's); without a GPU, sm_90's."""
    return HOPPER_SMEM_BYTES
